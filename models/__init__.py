"""genrank models: tokenisation, layers, CADET-style teacher, TM20K student, training, metrics.

No Dagster here; assets/ call these functions.

Public API (what the pipeline calls)
------------------------------------
    from models import (TeacherConfig, StudentConfig, TrainConfig, preset,
                        train_teacher, train_student, predict, evaluate, save_model, load_model)

    teacher_cfg, student_cfg, train_cfg = preset("demo")     # "tiny" | "demo" | "large" (seed sizes)

    # weekly: full-token teacher over a trailing window of training_samples
    res = train_teacher(["lake/training_samples/date=2026-01-01", ...], TeacherConfig(), TrainConfig(),
                        val_paths="lake/training_samples/date=2026-01-08", ckpt_dir="ckpt/teacher")
    save_model(res.model, "teacher.safetensors", metadata={...})  # atomic; load_model("teacher.safetensors")

    # daily: teacher probabilities for day D's impressions (cache as Parquet keyed by impression_id)
    probs = predict(load_model("teacher.safetensors"), "lake/training_samples/date=D")
    #   -> DataFrame(impression_id, user_id, position_bucket, p_bucket_0..K-1, p, logit)
    #      p / logit: the head of the impression's real position bucket (serving conditions)

    # daily: student warm-started from yesterday's candidate, labels + KD on the teacher's p
    res = train_student("lake/training_samples/date=D", probs[["impression_id", "p"]], StudentConfig(),
                        TrainConfig(), init_from="student_prev.safetensors")
    metrics = evaluate(res.model, "lake/training_samples/date=D+1")
    #   -> auc, gauc, logloss, bucket{k}_auc / _calibration / _n, tokens_per_s, len_before/after_avg/p90, ...

Inputs: `samples_paths` is a file, a `date=D` folder, the dataset root or a list of those
(the `training_samples` contract: one row per event, contiguous per user, sorted by
(user_id, ts_ms, event_rank)). `teacher_probs` is a DataFrame/Series/Parquet path(s) with
impression_id and p; impressions without a teacher probability just skip the KD term.
All results are `TrainResult(model, step, history, val_metrics, throughput, checkpoint)`.
DDP: launch any script that calls these with `torchrun --nproc_per_node N`; gloo on CPU,
NCCL on GPU; the token budget is per rank.

Modules
-------
config     dataclass configs (defaults cite the seed papers)
data/      Parquet streaming by row group and stable hashing (samples), the shared token layout (tokens),
           cross features, teacher tokens, student tokens with LITM/PATM, serving requests, packing (batches)
masks      (lo, hi) bounds of the single interval contract: causal, delay, candidates, window+global
kernels/   interval attention: torch reference (the spec) + Triton fwd/bwd, one dispatch function
layers     embeddings, time RoPE, gated pre-norm blocks with QK-norm, bucket heads, aux heads
backbone   what the teacher and the student share (embeddings, blocks, RoPE, heads)
teacher    CADET-style decoder; student: LPTM + dual heads; train: loop + API; metrics (a synthetic samples writer for tests: testkit/synthetic_samples.py)
"""
from .config import (BackboneConfig, FeatureConfig, MaskConfig, RoPEConfig, StudentConfig, TeacherConfig,
                     TrainConfig, preset)
from .train import (TrainResult, build_model, calibrate, calibrate_on_days, evaluate, fit, fit_with_holdout,
                    load_model, predict, save_model, train_student, train_teacher)

__all__ = ["BackboneConfig", "FeatureConfig", "MaskConfig", "RoPEConfig", "StudentConfig", "TeacherConfig",
           "TrainConfig", "TrainResult", "preset", "build_model", "calibrate", "calibrate_on_days", "evaluate", "fit",
           "fit_with_holdout", "load_model", "predict", "save_model", "train_student", "train_teacher"]
