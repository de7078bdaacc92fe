"""Run by tests/test_model_init.py, as one process or under torchrun: every model given is built twice, by
lib/model_init.build_scorer (meta device → shard → to_empty → weights into the shards) and by the path it replaced
(`from_pretrained(path, dtype).to(device)` → TokenScorer → lib/dist.shard), and also unsharded as a plain reference;
prints one JSON line (rank 0) of what matched, bit for bit.

    python tests/model_init_worker.py PATH:DTYPE:MODE ...        (MODE: student | student-ac | frozen)
"""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch                                                              # noqa: E402
from transformers import AutoModelForCausalLM                             # noqa: E402

from lib.train import dist as D                                                 # noqa: E402
from lib.train.model_init import build_scorer                                   # noqa: E402
from lib.train.scoring import TokenScorer, pack                                 # noqa: E402


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def outputs(scorer, batch, K, grad):
    """The student's scoring pass (sampled log-prob, top-K ids and log-probs, entropy), a teacher's given-id pass,
    and with `grad` the gradient of a loss over them (full tensors, by parameter name)."""
    with torch.set_grad_enabled(grad):
        lp, ids, topk_lp, ent = scorer(batch, None, topk=K)
        given, ent_t = scorer(batch, torch.cat([batch.targets_N[:, None], ids], 1), with_entropy=True)
        out = {"lp": lp, "ids": ids, "topk_lp": topk_lp, "ent": ent, "given": given, "ent_t": ent_t}
        if grad:
            (lp.sum() + 0.3 * topk_lp.sum() - 0.1 * ent.sum()).backward()
            out |= {"grad/" + n: full(p.grad) for n, p in scorer.named_parameters()}
    return {k: v.detach() for k, v in out.items()}


def main(specs):
    d = D.init()
    results = []
    for spec in specs:
        path, dtype, mode = spec.rsplit(":", 2)
        dtype, path = getattr(torch, dtype), Path(path)
        kw = dict(frozen=mode == "frozen", activation_checkpointing=mode == "student-ac", temperature=0.7)
        meta = build_scorer(path, dtype, d.device, **kw)
        old = TokenScorer(AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(d.device), temperature=0.7)
        plain = TokenScorer(AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(d.device), temperature=0.7)
        if kw["frozen"]:
            old.requires_grad_(False).eval()
        D.shard(old, bf16=False, activation_checkpointing=kw["activation_checkpointing"])
        lm, cfg = meta.lm, meta.lm.config
        V = cfg.vocab_size
        g = torch.Generator().manual_seed(0)
        batch = pack([torch.randint(0, V, (n,), generator=g).tolist() for n in (5, 9, 3)],
                     [torch.randint(0, V, (n,), generator=g).tolist() for n in (11, 4, 8)], 0).to(d.device)
        grad = not kw["frozen"]
        got, want, ref = (outputs(m, batch, 4, grad) for m in (meta, old, plain))
        with torch.no_grad():                   # a scoring pass: lib/dist.shard's reshard rule decides what stays
            meta(batch, None, topk=4)
        w = D.decoder_layers(meta)[0].self_attn.q_proj.weight
        gathered = not hasattr(w, "full_tensor")                   # FSDP2 swaps the gathered plain tensor in
        pushed = dict(D.full_params(meta))                         # the sampler's push reshards first
        resharded = hasattr(D.decoder_layers(meta)[0].self_attn.q_proj.weight, "full_tensor")
        mp, op = dict(meta.named_parameters()), dict(old.named_parameters())
        r = {"spec": spec, "rank": d.rank,
             "param_names": list(mp) == list(op),
             "params": all(torch.equal(full(mp[n]), full(op[n])) and mp[n].dtype == op[n].dtype for n in mp),
             "buffers": len(list(meta.named_buffers())) == len(list(old.named_buffers())) and all(
                 na == nb and torch.equal(a, b) and a.dtype == b.dtype
                 for (na, a), (nb, b) in zip(meta.named_buffers(), old.named_buffers(), strict=True)),
             "tied": (lm.lm_head.weight is lm.model.embed_tokens.weight) == bool(cfg.tie_word_embeddings),
             "training": lm.training == old.lm.training,
             "gathered_after_forward": gathered == (grad and d.world == 1),     # trainable, one rank: kept gathered
             "push_reshards": resharded and all(torch.equal(a, full(b)) for a, b in zip(pushed.values(), mp.values(), strict=True)),
             "requires_grad": [p.requires_grad for p in mp.values()] == [p.requires_grad for p in op.values()],
             "outputs": {k: torch.equal(got[k], want[k]) for k in want},
             "outputs_vs_unsharded": {k: torch.equal(got[k], ref[k]) for k in want if not k.startswith("grad/")}}
        results.append(r)
        del meta, old, plain
    gathered = [None] * d.world
    torch.distributed.all_gather_object(gathered, results)
    if d.main:
        print("RESULTS " + json.dumps([r for rank in gathered for r in rank]), flush=True)
    torch.distributed.barrier()                         # no rank tears the group down while another still uses it
    torch.distributed.destroy_process_group()
    # Leave without the interpreter's teardown, which this test does not check. Once in CI, under load, rank 0 aborted
    # there after RESULTS was printed ("terminate called without an active exception"); the likely cause, not
    # reproduced here, is a gloo worker thread letting go of a finished collective's tensor while Python finalizes
    # (pytorch/pytorch#179291).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
