"""Training loop and the API the pipeline calls.

    train_teacher(samples_paths, config, train=None, val_paths=None, ckpt_dir=None) -> TrainResult
    train_student(samples_paths, teacher_probs, config, train=None, init_from=None, ...) -> TrainResult
    predict(model, samples_paths) -> DataFrame(impression_id, user_id, position_bucket,
                                               p_bucket_0..K-1, p, logit)
    evaluate(model, samples_paths) -> dict (AUC, GAUC, log-loss, per-bucket calibration, lengths, tokens/s)
    save_model(model, path) / load_model(path)      safetensors: weights + JSON config, never a pickle

AdamW (no decay on norms, biases, embeddings), linear warm-up, gradient clipping, bf16 autocast
on CUDA only, atomic checkpoints with exact resume (model, optimizer, scheduler, data position,
RNG), log lines with loss and tokens/s (and a tqdm bar if asked), DistributedDataParallel when
launched with torchrun (gloo on CPU, NCCL on GPU): every rank reads the same deterministic stream
of global batches and takes its balanced share; losses are normalised by the *global* counts so
that N ranks compute exactly the gradient of one process on the same global batch.
Validation and prediction always run under serving conditions (delay mask on, no aux heads).
Passes are chosen by the data: with a held-out slice (TrainConfig.holdout: the newest day's latest
impressions, data.time_holdout) fit scores it after every pass, stops after TrainConfig.patience passes
without a better AUC, keeps the best pass's weights and fits the served head's per-bucket calibration on
it. A fresh model's heads start at the training window's observed CTR per bucket.
"""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn as nn

from contracts import settings
from transforms.atomic import staged_file

from .config import StudentConfig, TeacherConfig, TrainConfig, from_dict, to_dict
from .data import PackedLoader, collate, observed_ctr, split_for_ranks, time_holdout
from .layers import BucketHeads
from .metrics import Throughput, effective_lengths, peak_memory_bytes, summarize_predictions
from .student import Student
from .teacher import Teacher

log = logging.getLogger("genrank.models")


# ----------------------------------------------------------------------------- models & files

def build_model(cfg) -> nn.Module:
    return Teacher(cfg) if isinstance(cfg, TeacherConfig) else Student(cfg)


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def save_model(model: nn.Module, path: str, metadata: dict | None = None) -> str:
    """Weights as safetensors with the kind, config and metadata as JSON in its header (atomic). No pickle:
    whoever can write a checkpoint can change a model's weights, never run code where it is loaded."""
    from safetensors.torch import save_model as save_safetensors

    m = _unwrap(model)
    with staged_file(Path(path)) as staging:
        save_safetensors(m, str(staging), metadata={"kind": m.kind, "config": json.dumps(to_dict(m.cfg)),
                                                    "metadata": json.dumps(metadata or {})})
    return path


def load_model(path: str, map_location="cpu") -> nn.Module:
    """A model saved by ``save_model``; anything else (a pickle in particular) is refused unread."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_model as load_safetensors

    try:
        with safe_open(path, framework="pt") as f:
            header = f.metadata() or {}
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{path} is not a safetensors checkpoint ({exc}); refusing it: checkpoints are "
                         "never unpickled") from exc
    if header.get("kind") not in ("teacher", "student") or "config" not in header:
        raise ValueError(f"{path}: a safetensors file without genrank's kind/config header")
    cfg = from_dict(TeacherConfig if header["kind"] == "teacher" else StudentConfig, json.loads(header["config"]))
    model = build_model(cfg)
    load_safetensors(model, path, strict=True, device=str(map_location))
    model.metadata = json.loads(header.get("metadata", "{}"))
    return model.eval()  # loaded to score (id dropout off); fit() switches to training mode itself


# ----------------------------------------------------------------------------- distributed

def _dist_setup(device: torch.device) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if settings.torchrun_world()[0] > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device(train: TrainConfig) -> torch.device:
    if train.device:
        return torch.device(train.device)
    if torch.cuda.is_available():
        return torch.device("cuda", settings.torchrun_world()[1])
    return torch.device("cpu")


# ----------------------------------------------------------------------------- loop

@dataclass
class TrainResult:
    model: nn.Module
    step: int
    history: list[dict] = field(default_factory=list)
    val_metrics: dict = field(default_factory=dict)
    throughput: dict = field(default_factory=dict)
    checkpoint: str | None = None
    best_epoch: int = 0          # the pass whose weights were kept (0: no held-out slice chose one)
    val_curve: list = field(default_factory=list)  # held-out score after each pass


def _param_groups(model: nn.Module, wd: float):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in n else no_decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def _global_counts(toks: list) -> dict[str, float]:
    tg = [t.targets for t in toks]
    lab = np.concatenate([t.label for t in tg])
    return {"ctr": float(len(lab)), "ctr_distill": float(len(lab)), "click_type": float((lab > 0).sum()),
            "dwell": float(sum((~np.isnan(t.log_dwell)).sum() for t in tg)),
            "kd": float(sum((~np.isnan(t.teacher_p)).sum() for t in tg))}


def _ckpt_path(ckpt_dir: str) -> str:
    return os.path.join(ckpt_dir, "latest.pt")


def _heads(model: nn.Module) -> list[BucketHeads]:
    return [m for m in model.modules() if isinstance(m, BucketHeads)]


def served_head(model: nn.Module) -> BucketHeads:
    """The head whose probabilities predict() returns and the ONNX graph serves."""
    m = _unwrap(model)
    return m.main_head if m.kind == "student" else m.heads


def _score(pred: pd.DataFrame) -> float:
    """What picks the pass: held-out AUC (the ranking the gates judge first), or minus the log-loss where the
    slice has a single class and AUC is undefined."""
    from .metrics import auc, log_loss

    a = auc(pred["label"].to_numpy(), pred["p"].to_numpy()) if len(pred) else float("nan")
    return float(a) if math.isfinite(a) else -float(log_loss(pred["label"].to_numpy(), pred["p"].to_numpy()))


def calibration_shifts(pred: pd.DataFrame, n_buckets: int, min_clicks: int = 10) -> np.ndarray:
    """Per-bucket logit shifts that make the mean predicted CTR equal the observed CTR on ``pred`` (held-out
    predictions: position_bucket, logit, label). A bucket with fewer than ``min_clicks`` clicks takes the
    shift fitted on all buckets together; no click at all leaves 0."""
    z_all = pred["logit"].to_numpy(np.float64)
    y_all = pred["label"].to_numpy(np.float64)
    b_all = np.clip(pred["position_bucket"].to_numpy(np.int64), 0, n_buckets - 1)

    def shift(z, y):
        if y.sum() < 1 or y.sum() >= len(y):
            return 0.0
        d = 0.0
        for _ in range(50):  # Newton on sum(sigmoid(z + d)) = sum(y): monotone, converges in a few steps
            p = 1.0 / (1.0 + np.exp(-(z + d)))
            step = (p.sum() - y.sum()) / max((p * (1 - p)).sum(), 1e-9)
            d = float(np.clip(d - step, -10.0, 10.0))
            if abs(step) < 1e-7:
                break
        return d

    pooled = shift(z_all, y_all)
    return np.array([shift(z_all[b_all == k], y_all[b_all == k]) if y_all[b_all == k].sum() >= min_clicks else pooled
                     for k in range(n_buckets)])


def calibrate(model: nn.Module, held_out_paths, device=None) -> np.ndarray:
    """Fits the served head's per-bucket calibration on held-out samples (impressions the model never trained
    on): the logit shifts that make its mean predicted CTR the observed CTR of each bucket there
    (calibration_shifts). fit() calls it on its held-out slice; a caller with more such slices (the daily
    student's earlier days, assets.training) calls it again on all of them. Returns the shifts."""
    head = served_head(model)
    head.calibration.zero_()
    pred = predict(model, held_out_paths, device=device, with_labels=True)
    shifts = calibration_shifts(pred, head.calibration.numel())
    head.calibration.copy_(torch.as_tensor(shifts))
    return shifts


def calibrate_on_days(model: nn.Module, day_paths, holdout: float, work_dir: str, device=None) -> np.ndarray:
    """calibrate() on the held-out slice of each day (data.time_holdout: the day's latest ``holdout`` share of
    targets, written under ``work_dir``): the daily student's calibration window, in the pipeline and in
    benchmarks/quality_suite. Returns the shifts."""
    held_out = [time_holdout([str(p)], holdout, os.path.join(work_dir, f"day-{i}"))[1][0]
                for i, p in enumerate(day_paths)]
    return calibrate(model, held_out, device=device)


def fit(model: nn.Module, samples_paths, train: TrainConfig | None = None, teacher_probs=None, val_paths=None,
        ckpt_dir: str | None = None, resume: bool = True, base_rate_prior: bool = True) -> TrainResult:
    """Trains `model` (Teacher or Student) on the samples; see module doc. ``base_rate_prior``: start the
    heads at the training samples' observed CTR per bucket (a fresh model; a warm start keeps its own).
    With ``val_paths`` (a held-out, later slice) the slice picks the pass: scored after every pass, training
    stops after ``train.patience`` passes without a better score, the best pass's weights are kept and the
    served head's per-bucket calibration is fitted on the slice."""
    train = train or TrainConfig()
    device = _device(train)
    rank, world = _dist_setup(device)
    torch.manual_seed(train.seed)
    core = model.to(device)
    kind = core.kind
    for head in _heads(core):  # training runs uncalibrated; the shift is refitted at the end
        head.calibration.zero_()
    if base_rate_prior:
        clicks, shown = observed_ctr(samples_paths, core.cfg.backbone.n_buckets)
        if shown.sum() > 0:
            pooled = clicks.sum() / shown.sum()
            ctr = np.where(shown > 0, clicks / np.maximum(shown, 1), pooled)
            for head in _heads(core):
                head.set_prior(torch.as_tensor(ctr))
    opt = torch.optim.AdamW(_param_groups(core, train.weight_decay), lr=train.lr, betas=train.betas)
    warm = max(1, train.warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    step, epoch0, skip = 0, 0, 0
    best: dict = {"score": -math.inf, "epoch": 0, "state": None, "curve": []}
    if ckpt_dir and resume and os.path.exists(_ckpt_path(ckpt_dir)):
        ck = torch.load(_ckpt_path(ckpt_dir), map_location=device, weights_only=True)  # tensors and plain data only
        core.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        sched.load_state_dict(ck["sched"])
        step, epoch0, skip = ck["step"], ck["epoch"], ck["batch_in_epoch"]
        best = ck.get("best", best)
        torch.set_rng_state(ck["rng"].cpu())
        log.info("resumed from %s at step %d (epoch %d, batch %d)", _ckpt_path(ckpt_dir), step, epoch0, skip)
    net = core
    if world > 1:
        net = nn.parallel.DistributedDataParallel(core, device_ids=[device.index] if device.type == "cuda" else None)
    amp = device.type == "cuda" and train.amp_bf16
    loader = PackedLoader(samples_paths, kind, core.cfg, train.token_budget, seed=train.seed,
                          shuffle_buffer=train.shuffle_buffer, teacher_probs=teacher_probs, world=world,
                          tokenizer=core.tokenizer())
    history: list[dict] = []
    thr = Throughput()
    bar = None
    if train.progress and rank == 0:
        try:
            from tqdm.auto import tqdm
            bar = tqdm(total=train.max_steps, initial=step, desc=f"train {kind}", unit="step")
        except ImportError:
            bar = None
    done = train.max_steps is not None and step >= train.max_steps

    def save_ckpt(epoch, bi):
        if ckpt_dir and rank == 0:
            with staged_file(Path(_ckpt_path(ckpt_dir))) as staging:
                torch.save({"model": core.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                            "step": step, "epoch": epoch, "batch_in_epoch": bi, "rng": torch.get_rng_state(),
                            "kind": kind, "config": to_dict(core.cfg), "best": best}, staging)
        if world > 1:
            dist.barrier()

    def score_pass(passes: int) -> None:
        """Held-out score of the weights after `passes` passes (a pass cut by max_steps counts as one); every
        rank scores the same slice with the same weights, so all take the same decision."""
        score = _score(predict(core, val_paths, device=device, with_labels=True))
        best["curve"].append(round(score, 4))
        if score > best["score"]:
            best.update(score=score, epoch=passes, state={k: v.detach().clone() for k, v in core.state_dict().items()})
        if rank == 0:
            log.info(f"{kind} pass {passes} held-out score {score:.4f} (best: pass {best['epoch']})")

    epoch = epoch0
    while not done and epoch < train.epochs and not (val_paths is not None and best["state"] is not None
                                                     and epoch - best["epoch"] >= train.patience):
        core.train()
        batches = 0
        for bi, gbatch in enumerate(loader.iter_epoch(epoch)):
            batches += 1
            if epoch == epoch0 and bi < skip:
                continue
            # A rank left without a sample (a global batch of fewer samples than ranks) runs the first one with
            # weight 0: every rank joins the gradient all-reduce and the step is the one of a single process.
            mine = split_for_ranks(gbatch, world)[rank]
            weight = 1.0 if mine else 0.0
            mine = mine or gbatch[:1]
            counts = _global_counts(gbatch)
            batch = collate(mine).to(device)
            tg = batch.target_tensors(device)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=amp):
                out = net(batch, serving=False)
            sums = core.loss_sums(out, tg)
            loss = 0.0
            parts = {}
            for name, (s, _, w) in sums.items():
                c = max(1.0, counts.get(name, 1.0))
                loss = loss + w * s / c
                parts[name] = s.detach() / c
            opt.zero_grad(set_to_none=True)
            (loss * (world * weight)).backward()  # DDP averages over ranks -> gradient of the global objective
            gnorm = torch.nn.utils.clip_grad_norm_(core.parameters(), train.grad_clip)
            opt.step()
            sched.step()
            step += 1
            vals = weight * torch.stack([loss.detach().float()] + [v.float() for v in parts.values()])
            if world > 1:
                dist.all_reduce(vals)
            rec = {"step": step, "epoch": epoch, "loss": float(vals[0]), "grad_norm": float(gnorm),
                   **{k: float(v) for k, v in zip(parts, vals[1:])}}
            thr.add(batch.n_tokens * world, batch.n_events * world)
            rec.update(thr.rates())
            history.append(rec)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{rec['loss']:.4f}", tok_s=f"{rec['tokens_per_s']:.0f}")
            if rank == 0 and (step % train.log_every == 0 or step == 1):
                msg = (f"{kind} step {step} epoch {epoch} loss {rec['loss']:.4f} ctr {rec['ctr']:.4f} "
                       f"grad {rec['grad_norm']:.3f} tok/s {rec['tokens_per_s']:.0f}")
                log.info(msg)
            if not math.isfinite(rec["loss"]):
                raise FloatingPointError(f"non-finite loss at step {step}")
            if train.ckpt_every and step % train.ckpt_every == 0:
                save_ckpt(epoch, bi + 1)
            if train.max_steps is not None and step >= train.max_steps:
                done = True
                if val_paths is not None:
                    score_pass(epoch + 1)
                save_ckpt(epoch, bi + 1)
                break
        else:
            skip = 0
            if val_paths is not None:
                score_pass(epoch + 1)
            save_ckpt(epoch + 1, 0)
        if not batches:  # nothing to train on: more passes change nothing
            break
        epoch += 1
    if bar is not None:
        bar.close()
    if best["state"] is not None:
        core.load_state_dict(best["state"])
    res = TrainResult(model=core, step=step, history=history, throughput=thr.rates(),
                      checkpoint=_ckpt_path(ckpt_dir) if ckpt_dir else None, best_epoch=best["epoch"],
                      val_curve=list(best["curve"]))
    res.throughput["peak_memory_bytes"] = peak_memory_bytes(device)
    if val_paths is not None:
        calibrate(core, val_paths, device=device)
        if rank == 0:
            res.val_metrics = evaluate(core, val_paths, token_budget=train.token_budget, device=device)
    return res


def fit_with_holdout(model, samples_paths, train: TrainConfig | None, teacher_probs=None, val_paths=None,
                     ckpt_dir: str | None = None, resume: bool = True, warm: bool = False) -> TrainResult:
    """fit() with the held-out slice: ``val_paths`` if given, else (train.holdout > 0) the newest day's latest
    targets (data.time_holdout), written next to the checkpoint or to a temporary folder. What train_teacher and
    train_student run, for a model they do not build (the benchmarks' ablations)."""
    import tempfile

    train = train or TrainConfig()
    if val_paths is not None or train.holdout <= 0:
        return fit(model, samples_paths, train, teacher_probs, val_paths, ckpt_dir, resume, base_rate_prior=not warm)
    with tempfile.TemporaryDirectory(prefix="genrank-holdout-") as tmp:
        fit_paths, held_out = time_holdout(samples_paths, train.holdout, tmp)
        return fit(model, fit_paths, train, teacher_probs, held_out, ckpt_dir, resume, base_rate_prior=not warm)


def train_teacher(samples_paths, config: TeacherConfig, train: TrainConfig | None = None, val_paths=None,
                  ckpt_dir: str | None = None, resume: bool = True) -> TrainResult:
    """Trains the full-token teacher (delay mask on target rows unless config.mask.train_delay=False).
    With train.holdout > 0 (and no val_paths) the newest day's latest targets choose the pass and calibrate."""
    torch.manual_seed((train or TrainConfig()).seed)  # deterministic initialisation
    return fit_with_holdout(Teacher(config), samples_paths, train, None, val_paths, ckpt_dir, resume, warm=False)


def train_student(samples_paths, teacher_probs, config: StudentConfig, train: TrainConfig | None = None,
                  init_from=None, val_paths=None, ckpt_dir: str | None = None, resume: bool = True) -> TrainResult:
    """Trains the student. teacher_probs: DataFrame / Parquet path(s) with impression_id and p (the teacher's
    probability on the impression's real bucket), or None (KD off). init_from: a model, a save_model path or a
    state dict (warm start from the previous candidate). Held-out slice: as train_teacher."""
    torch.manual_seed((train or TrainConfig()).seed)
    model = Student(config)
    if init_from is not None:
        _warm_start(model, init_from)
    return fit_with_holdout(model, samples_paths, train, teacher_probs, val_paths, ckpt_dir, resume,
                            init_from is not None)


def _warm_start(model: nn.Module, init_from):
    if isinstance(init_from, (str, os.PathLike)):
        init_from = load_model(str(init_from)).state_dict()
    elif isinstance(init_from, nn.Module):
        init_from = _unwrap(init_from).state_dict()
    model.load_state_dict(init_from)


# ----------------------------------------------------------------------------- inference

@torch.no_grad()
def predict(model: nn.Module, samples_paths, token_budget: int | None = None, device=None,
            with_labels: bool = False, stats: dict | None = None) -> pd.DataFrame:
    """Scores every target impression under serving conditions. One row per impression:
    impression_id, user_id, position_bucket, p_bucket_0..K-1, p (the real bucket's head), logit
    (+ label if with_labels). `stats`, if given, receives tokens/s and effective lengths."""
    m = _unwrap(model)
    device = torch.device(device) if device is not None else next(m.parameters()).device
    was_training = m.training
    m.eval().to(device)
    # generous budget: a sample's targets are only ever dropped if they alone exceed it
    budget = token_budget or max(16384, 4 * getattr(m.cfg, "max_len", 4096))
    loader = PackedLoader(samples_paths, m.kind, m.cfg, budget, seed=None, tokenizer=m.tokenizer())
    frames, thr, toks_all = [], Throughput(), []
    for toks in loader.iter_epoch(0):
        batch = collate(toks).to(device)
        logits = m(batch, serving=True)["logits"].float()
        thr.add(batch.n_tokens, batch.n_events)
        toks_all.extend(toks) if stats is not None else None
        tg = batch.targets
        pk = torch.sigmoid(logits).cpu().numpy()
        b = np.clip(tg.bucket, 0, pk.shape[1] - 1)
        z = logits.cpu().numpy()[np.arange(len(b)), b]
        df = pd.DataFrame({"impression_id": tg.impression_id, "user_id": tg.user_id, "position_bucket": tg.bucket.astype(np.int32)})
        for k in range(pk.shape[1]):
            df[f"p_bucket_{k}"] = pk[:, k]
        df["p"] = pk[np.arange(len(b)), b]
        df["logit"] = z
        if with_labels:
            df["label"] = tg.label.astype(np.int8)
        frames.append(df)
    if was_training:
        m.train()
    if stats is not None:
        stats.update(thr.rates())
        stats.update(effective_lengths(toks_all))
    if not frames:
        cols = ["impression_id", "user_id", "position_bucket"] + [f"p_bucket_{k}" for k in range(m.cfg.backbone.n_buckets)] + ["p", "logit"]
        return pd.DataFrame(columns=cols + (["label"] if with_labels else []))
    return pd.concat(frames, ignore_index=True)


def evaluate(model: nn.Module, samples_paths, token_budget: int | None = None, device=None) -> dict:
    """AUC, GAUC, log-loss, per-bucket AUC and calibration under serving conditions, plus tokens/s,
    average / p90 history length before and after merging, peak memory."""
    stats: dict = {}
    pred = predict(model, samples_paths, token_budget, device, with_labels=True, stats=stats)
    out = summarize_predictions(pred) if len(pred) else {"n": 0}
    out.update(stats)
    out["peak_memory_bytes"] = peak_memory_bytes(device or next(_unwrap(model).parameters()).device)
    return out
