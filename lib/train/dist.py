"""torchrun, FSDP2 and checkpoints, in the torchtitan manner (DESIGN.md §7.7).

- `init()`: one process group for every launch — gloo on CPU, NCCL on CUDA; a plain `python` launch is a group of 1.
- `shard(model)`: `fully_shard` each decoder layer, then the root; bf16 params with fp32 gradient reduction on CUDA
  (fp32 everywhere on CPU, so 1-process and 2-process runs agree to float tolerance). Frozen models are sharded too.
- `micro_batches(model, mbs)`: the update's loop; on one rank the gradients are reduced once, after the last one.
- `full_state_dict(model)`: the unsharded weights (every rank takes part; rank 0 receives them on CPU).
- `save_hf(...)`: a merged Hugging Face folder, loadable by `AutoModelForCausalLM.from_pretrained`, whose config,
  generation config and tokenizer files are copied byte-identical from the initial model.
- `save_resume` / `load_resume`: model + optimizer gathered to rank 0 as safetensors (nothing unpickled on load), the
  loop state and param groups as JSON, swapped in without a moment when no complete state exists; sha256s recorded
  when written, verified on load.
- `adamw(model, lr, weight_decay, offload)`: the trainer's AdamW; with `offload` an `OffloadAdamW`, whose moments live
  in (pinned) host memory and are streamed through the device chunk by chunk for each step (03 --offload-optimizer).
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from lib import runs
from lib.artifacts import atomic_write_json, read_json, umask_mode

HF_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt", "added_tokens.json")


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def init() -> Dist:
    """Join (or, for a plain `python` launch, create) the process group.

    A plain launch is a group of one, so every collective below still works. It rendezvouses through an in-memory
    store, not a TCP port: a port picked from the process id (29500 + pid % 1000) once collided when 15 campaign jobs
    ran at once (EADDRINUSE), and a group of one has no peer to meet."""
    alone = "RANK" not in os.environ or (os.environ.get("WORLD_SIZE") == "1" and "MASTER_PORT" not in os.environ)
    if alone:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    cuda = torch.cuda.is_available()
    local = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        backend = "nccl" if cuda else "gloo"
        if alone:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group(backend)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    return Dist(dist.get_rank(), dist.get_world_size(), local, device)


def finish() -> None:
    """Leave the process group together: every rank waits here for the others, then destroys its group. A rank that
    destroyed its group while its peer was still at work (rank 0 checking its checkpoints and writing the manifest)
    once died at exit with `terminate called without an active exception`, a gloo thread left joinable (rank 1 of a
    two-process CPU run, after its last step, with the test suite loading both cores)."""
    dist.barrier()
    dist.destroy_process_group()


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    lm = getattr(model, "lm", model)
    return lm.model.layers


def shard(model: nn.Module, *, bf16: bool, activation_checkpointing: bool = False, compile: bool = False) -> nn.Module:
    """FSDP2: each decoder layer is one unit (its params are gathered just before it runs), then the root.
    Order as in torchtitan: activation checkpointing, then torch.compile of each layer, then fully_shard.

    Layers reshard after forward, except those of a trainable model on one rank: its shard is the whole model, and
    resharding would copy (and cast) every layer's weights again for the backward of every micro-batch. FSDP2 still
    reshards after backward (after the last micro-batch: `micro_batches`), so the optimizer step and the next gather
    see the new weights; the cost is one bf16 copy of the model in memory. Frozen models reshard: they are gathered
    once per scoring micro-batch, and a second copy of each would be memory."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
          else MixedPrecisionPolicy())
    frozen = not any(p.requires_grad for p in model.parameters())
    reshard = frozen or dist.get_world_size() > 1
    layers = decoder_layers(model)
    if compile:
        allow_recompiles()
    for i, layer in enumerate(layers):
        if activation_checkpointing:
            layer = checkpoint_wrapper(layer, preserve_rng_state=False)
            layers[i] = layer
        if compile:
            layer.compile()          # in place: identical layers share one compiled graph
        # the last layer stays gathered after forward: backward needs it first
        fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard and i < len(layers) - 1)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    return model


def micro_batches(model: nn.Module, items: list):
    """Yield the update's micro-batches. On one rank, FSDP2 is told to keep the weights gathered and to sum the
    gradients unsharded (in its fp32 reduce dtype) until the last micro-batch, which reduces them once and reshards:
    the shard is the whole model there, so per-micro-batch gathers and reduce-scatters are copies that change
    nothing. With more ranks every micro-batch reduces and reshards as usual (memory: unsharded fp32 gradients)."""
    one = dist.get_world_size() == 1
    for i, item in enumerate(items):
        if one:
            last = i == len(items) - 1
            model.set_requires_gradient_sync(last)
            model.set_reshard_after_backward(last)
        yield item


RECOMPILE_LIMIT = 64


def allow_recompiles() -> None:
    """Every decoder layer of every model shares one compiled code object, and each (frozen | trainable) × (train |
    eval) × (grad | no grad) × (static | dynamic shape) × attention backend is its own graph: past dynamo's default
    limit of 8 the remaining variants silently run eagerly (on an H200, bench/RESULTS.md: packed scoring and update
    then took 4.35 and 4.46 s, compiled 3.5–3.9 and 3.5–4.0 s). Raised to RECOMPILE_LIMIT."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):      # the name since torch 2.6, and before
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))
            break


def full_state_dict(model: nn.Module) -> dict:
    """Unsharded weights on rank 0 (CPU), {} elsewhere; keys without wrapper prefixes. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {_clean(k): v for k, v in sd.items()}


def full_params(model: nn.Module):
    """(name, full tensor) for every parameter, on every rank: what is pushed into a sampler each step. Collective.
    Gathered layers (one rank keeps the student gathered after forward: `shard`) are resharded first, so that the
    push reads the fp32 master weights and not a bf16 compute copy."""
    from torch.distributed.fsdp import FSDPModule
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
    for name, p in model.named_parameters():
        t = p.data
        yield _clean(name), (t.full_tensor() if hasattr(t, "full_tensor") else t)


def _clean(name: str) -> str:
    for prefix in ("lm.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module."):
        name = name.replace(prefix, "")
    return name


def config_dtype(model_dir: Path) -> torch.dtype:
    """The dtype a model folder was saved in (config `dtype`, formerly `torch_dtype`): checkpoints keep it."""
    cfg = read_json(Path(model_dir) / "config.json")
    return getattr(torch, str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"))


def save_hf(state: dict, init_dir: Path, out: Path, dtype: torch.dtype, meta: dict,
            meta_name: str = "checkpoint.json") -> None:
    """Write a merged HF folder: weights in `dtype`, side files copied byte-identical from the initial model, `meta`
    as `meta_name`, and last the sha256 of every file (integrity.json); written as `<out>.tmp`, then renamed."""
    from huggingface_hub import save_torch_state_dict
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = read_json(init_dir / "config.json")
    state = {k: v.to(dtype).contiguous() for k, v in state.items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)   # tied: the embedding is the head; writing both would untie on load
    save_torch_state_dict(state, tmp, max_shard_size="5GB")
    umask_mode(*tmp.glob("*.safetensors"))                  # written 0600 by safetensors
    for name in HF_SIDE_FILES:
        if (init_dir / name).exists():
            shutil.copyfile(init_dir / name, tmp / name)
    atomic_write_json(tmp / meta_name, meta)
    runs.write_integrity(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


RESUME_TENSORS, RESUME_GROUPS = "state.safetensors", "optim_groups.json"


def save_resume(model: nn.Module, optim: torch.optim.Optimizer, state: dict, out: Path) -> None:
    """Model + optimizer gathered to rank 0 as one safetensors file (tensors only: nothing in a resume state is ever
    unpickled), the optimizer's param groups and the loop state as JSON, into `resume.tmp/`, their sha256s last
    (`integrity.json`: the mark of a complete state), then swapped in so that a complete state exists at every
    instant: resume → resume.old, resume.tmp → resume, delete resume.old. Collective."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    msd, osd = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    tmp, old, step = out.with_name(runs.RESUME_TMP), out.with_name(runs.RESUME_OLD), state.get("step")
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tensors, scalars, seen = {}, {}, set()
        for key, v in [(f"model/{k}", v) for k, v in msd.items()] + [
                (f"optim/{fqn}/{k}", v) for fqn, st in osd["state"].items() for k, v in st.items()]:
            if not torch.is_tensor(v):
                scalars[key] = v
                continue
            v = v.detach().cpu().contiguous()
            if v.untyped_storage().data_ptr() in seen:       # tied weights: one storage, saved twice
                v = v.clone()
            seen.add(v.untyped_storage().data_ptr())
            tensors[key] = v
        save_file(tensors, tmp / RESUME_TENSORS)
        umask_mode(tmp / RESUME_TENSORS)
        runs.fault("resume-written", step)
        atomic_write_json(tmp / RESUME_GROUPS, {"param_groups": osd["param_groups"], "scalars": scalars})
        atomic_write_json(tmp / "loop_state.json", state)
        runs.write_integrity(tmp)
        if out.exists():                        # (absent after a kill between the renames: resume.old is the state)
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
        runs.fault("renamed-old", step)
        os.replace(tmp, out)
        runs.fault("renamed-new", step)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load_resume(model: nn.Module, optim: torch.optim.Optimizer, src: Path) -> dict:
    """Verify the state's sha256s, then load model + optimizer in place (rank 0 reads the safetensors, each tensor is
    broadcast into the shards); returns the loop state. Collective. A state in the older torch.distributed.checkpoint
    format (its metadata a pickle) is refused, never loaded."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    fix = f"delete {src.parent} to restart the run from scratch"
    if not (src / RESUME_TENSORS).exists():
        raise SystemExit(f"{src} holds no {RESUME_TENSORS}: a resume state of an older format (pickled "
                         f"torch.distributed.checkpoint metadata), which is never loaded; {fix}")
    runs.verify_files(src, "the resume state", fix)
    msd, osd = {}, {}
    if dist.get_rank() == 0:
        flat, extra = load_file(src / RESUME_TENSORS), read_json(src / RESUME_GROUPS)
        for key, v in list(flat.items()) + list(extra["scalars"].items()):
            kind, rest = key.split("/", 1)
            if kind == "model":
                msd[rest] = v
            else:
                fqn, name = rest.rsplit("/", 1)
                osd.setdefault("state", {}).setdefault(fqn, {})[name] = v
        for g in extra["param_groups"]:                 # JSON turned AdamW's betas tuple into a list
            g.update({k: tuple(v) for k, v in g.items() if k == "betas"})
        osd["param_groups"] = extra["param_groups"]
    # two calls, not set_state_dict: given an empty model state (ranks > 0) that one treats the load as
    # optimizer-only there, and the ranks then disagree on the broadcasts (a hang)
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, msd, options=opts)
    set_optimizer_state_dict(model, optim, osd, options=opts)
    return read_json(src / "loop_state.json")


# --- AdamW with its moments in host memory (03 --offload-optimizer) ---

OFFLOAD_CHUNK_BYTES = 512 * 2**20     # parameters per streamed chunk (its two moments: twice that on the device)


def adamw(model: nn.Module, lr: float, weight_decay: float, offload: bool = False) -> torch.optim.Optimizer:
    """The trainer's AdamW over `model`'s parameters; `offload`: its moments kept in host memory (OffloadAdamW)."""
    cls = OffloadAdamW if offload else torch.optim.AdamW
    return cls(model.parameters(), lr=lr, weight_decay=weight_decay)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _wrap_like(local: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """`local` as a tensor of p's kind: a DTensor of p's mesh and placements when p is one (FSDP2's sharded params).
    Built from its spec, not with `DTensor.from_local`, which copies a host tensor onto a CUDA mesh's device: the
    offloaded moments' host views must stay on the host (FSDP2's own CPU offload wraps its host shards the same way).
    Not yet run on a GPU (bench/RESULTS.md §16)."""
    if not hasattr(p, "device_mesh"):
        return local
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    spec = DTensorSpec(p.device_mesh, tuple(p.placements), tensor_meta=TensorMeta(p.shape, p.stride(), local.dtype))
    return DTensor(local, spec, requires_grad=False)


class OffloadAdamW(torch.optim.AdamW):
    """torch's AdamW, the same arithmetic to the bit, with exp_avg and exp_avg_sq held in two flat host buffers
    (pinned when CUDA is there) instead of on the device: 8 bytes a parameter off the GPU (61 GB for a 7.6B student).

    `step()` cuts the parameters that have gradients into chunks of ≤ OFFLOAD_CHUNK_BYTES (in order, so a chunk's
    moments are one contiguous range of each buffer); each chunk's moments are copied to the device on one side
    stream, the chunk is stepped by AdamW's own `step` (the state pointing at the device copies), and the moments
    are copied back on another side stream, so the next chunk's upload, this chunk's arithmetic and the last chunk's
    download overlap. Between steps the state holds host views (DTensors of the parameter's mesh under FSDP2), so
    `state_dict`, torch.distributed.checkpoint and `load_state_dict` see an ordinary AdamW state; a loaded state is
    copied into the host buffers, never staged on the device whole. Off CUDA the same path runs with plain copies."""

    def __init__(self, params, chunk_bytes: int = OFFLOAD_CHUNK_BYTES, **kwargs):
        if kwargs.get("amsgrad") or kwargs.get("fused") or kwargs.get("capturable"):
            raise ValueError("OffloadAdamW: amsgrad, fused and capturable are not supported")
        super().__init__(params, **kwargs)
        self.chunk_bytes = chunk_bytes
        self._m = self._v = None
        self._offset: dict = {}

    def _ensure_host(self) -> None:
        """The two flat host buffers, one slot per trainable parameter in group order; an existing state copied in."""
        if self._m is not None:
            return
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if len({p.dtype for p in params}) > 1:
            raise ValueError(f"OffloadAdamW: parameters of one dtype, got {sorted({str(p.dtype) for p in params})}")
        n = 0
        for p in params:
            self._offset[p] = n
            n += _local(p).numel()
        pin = torch.cuda.is_available() and _local(params[0]).is_cuda
        self._m = torch.zeros(n, dtype=params[0].dtype, pin_memory=pin)
        self._v = torch.zeros(n, dtype=params[0].dtype, pin_memory=pin)
        self._adopt()

    def _host_view(self, buf: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        local = _local(p)
        return buf[self._offset[p]:self._offset[p] + local.numel()].view(local.shape)

    def _adopt(self) -> None:
        """Every state entry's moments copied into (unless already) the host buffers; state → host views."""
        for p, st in self.state.items():
            for key, buf in (("exp_avg", self._m), ("exp_avg_sq", self._v)):
                if key in st:
                    view = self._host_view(buf, p)
                    src = _local(st[key])
                    if src.data_ptr() != view.data_ptr():
                        view.copy_(src)
                    st[key] = _wrap_like(view, p)
            if torch.is_tensor(st.get("step")) and st["step"].device.type != "cpu":
                st["step"] = st["step"].cpu()

    def load_state_dict(self, state_dict: dict) -> None:
        """AdamW's load, except that the moments are not moved to the parameters' device (61 GB for a 7.6B
        student): each lands in the host buffers."""
        from torch.optim.optimizer import Optimizer
        policy = Optimizer._process_value_according_to_param_policy

        def keep_moments(param, value, param_id, param_groups, key=None):
            if key in ("exp_avg", "exp_avg_sq") and torch.is_tensor(value):
                return value.to(dtype=param.dtype)
            return policy(param, value, param_id, param_groups, key)
        Optimizer._process_value_according_to_param_policy = staticmethod(keep_moments)
        try:
            super().load_state_dict(state_dict)
        finally:
            Optimizer._process_value_according_to_param_policy = staticmethod(policy)
        if self._m is None:
            self._ensure_host()
        else:
            self._adopt()

    def _chunks(self, params: list) -> list[list]:
        out, size = [[]], 0
        for p in params:
            b = _local(p).numel() * p.element_size()
            if out[-1] and size + b > self.chunk_bytes:
                out.append([])
                size = 0
            out[-1].append(p)
            size += b
        return [c for c in out if c]

    def _upload(self, chunk: list, stream):
        """The chunk's moments on the device (flat), and the event after which they are there."""
        lo = self._offset[chunk[0]]
        hi = self._offset[chunk[-1]] + _local(chunk[-1]).numel()
        dev = _local(chunk[0]).device
        if stream is None:
            return lo, self._m[lo:hi].clone(), self._v[lo:hi].clone(), None
        with torch.cuda.stream(stream):
            m = self._m[lo:hi].to(dev, non_blocking=True)
            v = self._v[lo:hi].to(dev, non_blocking=True)
        return lo, m, v, stream.record_event()

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("OffloadAdamW.step takes no closure")
        self._ensure_host()
        for group in self.param_groups:
            live = [p for p in group["params"] if p.grad is not None]
            if not live:
                continue
            cuda = _local(live[0]).is_cuda
            up = torch.cuda.Stream(_local(live[0]).device) if cuda else None
            down = torch.cuda.Stream(_local(live[0]).device) if cuda else None
            chunks = self._chunks(live)
            staged, done = self._upload(chunks[0], up), []
            for i, chunk in enumerate(chunks):
                lo, m, v, ready = staged
                if cuda:
                    main = torch.cuda.current_stream()
                    main.wait_event(ready)
                    m.record_stream(main)
                    v.record_stream(main)
                if i >= 1 and cuda:       # the host waits for chunk i−1's download: ≤ 3 chunks' moments on the device
                    done[i - 1].synchronize()
                if i + 1 < len(chunks):
                    staged = self._upload(chunks[i + 1], up)
                self._step_chunk(group, chunk, lo, m, v)
                hi = lo + len(m)
                if cuda:
                    down.wait_stream(main)
                    with torch.cuda.stream(down):
                        self._m[lo:hi].copy_(m, non_blocking=True)
                        self._v[lo:hi].copy_(v, non_blocking=True)
                    m.record_stream(down)
                    v.record_stream(down)
                    done.append(down.record_event())
                else:
                    self._m[lo:hi].copy_(m)
                    self._v[lo:hi].copy_(v)
            if cuda:
                down.synchronize()          # the host buffers are the state again (checkpoints read them)
        return None

    def _step_chunk(self, group: dict, chunk: list, lo: int, m: torch.Tensor, v: torch.Tensor) -> None:
        """AdamW's own step on `chunk` alone, its state pointing at the device copies; then at the host views."""
        from torch.optim.optimizer import _get_scalar_dtype
        for p in chunk:
            st = self.state[p]
            if "step" not in st:                       # as AdamW initialises a state (non-fused, non-capturable)
                st["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype())
            a, n = self._offset[p] - lo, _local(p).numel()
            st["exp_avg"] = _wrap_like(m[a:a + n].view(_local(p).shape), p)
            st["exp_avg_sq"] = _wrap_like(v[a:a + n].view(_local(p).shape), p)
        groups = self.param_groups
        self.param_groups = [dict(group, params=chunk)]
        try:
            super().step()
        finally:
            self.param_groups = groups
        for p in chunk:
            self.state[p]["exp_avg"] = _wrap_like(self._host_view(self._m, p), p)
            self.state[p]["exp_avg_sq"] = _wrap_like(self._host_view(self._v, p), p)


def params_finite(model: nn.Module) -> bool:
    """Every parameter finite on every rank (a collective: each rank checks its shards)."""
    local = [(p.to_local() if hasattr(p, "to_local") else p).detach() for p in model.parameters()]
    bad = float(torch.stack([~torch.isfinite(x).all() for x in local]).any()) if local else 0.0   # one host sync
    return all_max(bad, device=local[0].device if local else None)[0] == 0.0


def all_sum(*values: float, device=None) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_max(*values: float, device=None) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def relaunch(script: str, nproc: int, argv: list[str]):
    """`python STAGE.py --nproc N …` → `torchrun --nproc-per-node N STAGE.py …` (current torchrun rejects its own
    short `--nproc` as ambiguous, so the stages take it and launch themselves)."""
    from torch.distributed.run import main as torchrun
    rest, skip = [], False
    for tok in argv:
        if skip:
            skip = False
        elif tok == "--nproc":
            skip = True
        elif not tok.startswith("--nproc="):
            rest.append(tok)
    torchrun(["--nproc-per-node", str(nproc), script, *rest])


def phase_peak_gb(d: Dist, cuda: bool) -> float | None:
    """The peak memory PyTorch allocated since the last call (GiB), then reset: one number per phase of a step."""
    if not cuda:
        return None
    gb = torch.cuda.max_memory_allocated(d.device) / 2**30
    torch.cuda.reset_peak_memory_stats(d.device)
    return gb
