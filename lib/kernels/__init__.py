"""The loop's kernels (DESIGN.md §12): token log-probs and log-ratios without an (N, V) fp32 temporary, from logits
(logratio.py, with its pure-torch reference) or straight from hidden states and the lm_head weight
(linear_logratio.py), the Triton kernels behind both (logratio_triton.py), and padding-free packed micro-batches
(varlen.py).

May import: nothing of the project outside lib/kernels/ (torch and Triton only), so a kernel can be read, tested and
benchmarked alone.
"""
