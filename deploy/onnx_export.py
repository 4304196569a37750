"""The served student as one ONNX graph: one request (a user's history + N candidates) in one pass.

Graph inputs (one request; every length dynamic):
    ev_feats   int64 (E, F)  the history events' token features, newest max_len events
    ev_group   int64 (E,)    the LITM -> PATM group of every event (0..G-1, oldest first)
    hist_ts    int64 (G,)    every group's newest member time (ms)
    cand_feats int64 (N, F)  the candidates' content features
    cand_ts    int64 (N,)    the request time of every candidate (ms)
    cand_cross float32 (N, C) the candidates' cross features (models.data.cross_counts); only for a student
                             that has them (FeatureConfig.cross_windows_days not empty)
Output:
    probs      float32 (N, K) P(click | the ad is shown in position bucket k), the main (label) tower

LITM and PATM merges and the cross-feature counts run before the graph, in ``models.data.request_tokens``,
exactly as at training time (id-equality, age and counting rules over numpy arrays, not tensor maths);
the group sums, LPTM's pair sums, the interval mask (history causal; candidates see the history visible
at request time minus the delay and themselves, never each other) and time RoPE are all inside the
graph, built from the inputs with standard ONNX ops, so onnxruntime needs no custom op (the one
non-standard node is onnxruntime's own fused RMSNorm, SimplifiedLayerNormalization, on every provider).

``RequestScorer`` is the torch module that is exported; it reuses the trained student's own layers
and is checked against ``Student.forward`` (the specification) by ``parity``.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from models.config import StudentConfig, from_dict, to_dict
from models.data import StudentTokens, collate_student
from models.student import Student
from transforms.atomic import staged_file

INPUT_NAMES = ("ev_feats", "ev_group", "hist_ts", "cand_feats", "cand_ts")
CROSS_INPUT = "cand_cross"
ONNX_FILE, CONFIG_FILE = "model.onnx", "serving.json"
ONNX_SHA256_TAG = "onnx_sha256"  # the registry tag the service checks the downloaded graph against
OUTPUT_NAME = "probs"
OPSET = 18
PARITY_TOLERANCE = 1e-4  # max |p_onnx - p_torch| over a request's candidates and buckets


def input_names(student: Student) -> list[str]:
    """The graph's inputs: cand_cross only for a student with cross features."""
    return list(INPUT_NAMES) + ([CROSS_INPUT] if student.cross is not None else [])


class RequestScorer(nn.Module):
    """One request through the student's layers with shape-derived (traceable) bounds."""

    def __init__(self, student: Student):
        super().__init__()
        cfg = student.cfg
        if cfg.mask.window is not None:
            raise ValueError("ONNX export supports full-history attention only (mask.window=None); "
                             "a sliding-window student needs the windowed bounds in the graph first")
        if type(student) is not Student:
            raise ValueError(f"{type(student).__name__} is not the served Student: the graph traces Student's own "
                             "layers, so a subclass (the benchmarks' ablations) would export what it does not do")
        self.student = student.eval()

    def _bounds(self, hist_ts: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
        """Every token's hi (every lo is 0: the history is causal, a candidate sees a prefix of it)."""
        G = hist_ts.shape[0]
        # A candidate sees the leading groups up to the first one newer than its cutoff (the running-max
        # rule of masks.visible_count): the index of the first True, with a True appended for "none newer".
        newer = torch.cat([hist_ts[None, :] > cut[:, None], torch.ones_like(cut[:, None], dtype=torch.bool)], 1)
        visible = newer.to(torch.uint8).argmax(1)
        return torch.cat([torch.arange(G, dtype=torch.long), visible])

    def _rope(self, ts: torch.Tensor):
        s = self.student
        if s.cfg.rope.mode == "index":
            pos = torch.arange(ts.shape[0], dtype=torch.float64)
        else:  # seconds relative to the newest token, as models.layers.rope_positions does per sequence
            pos = (ts - ts.max()).double() / 1000.0
        return s.rope.angles(pos)

    @staticmethod
    def _pair_sum(xh: torch.Tensor, ts: torch.Tensor):
        """LPTM on one sequence: tokens (2i, 2i+1) summed, oldest first (student.pair_merge)."""
        G = xh.shape[0]
        dst = torch.arange(G, dtype=torch.long) // 2
        G2 = (G + 1) // 2
        x2 = torch.zeros(G2, xh.shape[1], dtype=xh.dtype).index_add(0, dst, xh)
        t2 = torch.full((G2,), torch.iinfo(torch.long).min, dtype=torch.long).scatter_reduce(
            0, dst, ts, "amax", include_self=True)
        return x2, t2

    def forward(self, ev_feats, ev_group, hist_ts, cand_feats, cand_ts, cand_cross=None):
        s = self.student
        e = s.embed(ev_feats)
        xh = torch.zeros(hist_ts.shape[0], e.shape[1], dtype=e.dtype).index_add(0, ev_group, e)
        xc = s.embed_candidates(cand_feats, cand_cross)
        cut = cand_ts - s.delay_ms(serving=True)
        merges = s.merge_layers()
        x = torch.cat([xh, xc])
        G = xh.shape[0]
        hi = self._bounds(hist_ts, cut)
        cs = self._rope(torch.cat([hist_ts, cand_ts]))
        last = len(s.blocks) - 1
        for i, blk in enumerate(s.blocks):
            if i in merges:
                xh, hist_ts = self._pair_sum(x[:G], hist_ts)
                x = torch.cat([xh, x[G:]])
                G = xh.shape[0]
                hi = self._bounds(hist_ts, cut)
                cs = self._rope(torch.cat([hist_ts, cand_ts]))
            # The last layer's history rows feed nothing the head reads: there the history gives keys and
            # values only, and the block returns the candidates' rows (a third less work at 2 layers).
            queries_from = G if i == last else 0
            x = blk(x, None, hi[queries_from:], cs, n_keys=G, queries_from=queries_from)
        return torch.sigmoid(s.main_head(x).float())


def request_arrays(tokens: StudentTokens) -> dict[str, np.ndarray]:
    """The graph's inputs for one request's tokens (at least one candidate).

    A user without history gets one null placeholder group timed after every candidate's cutoff:
    onnxruntime aborts on some zero-length tensors, and a group no candidate can see changes nothing
    (each candidate then attends to itself only, as with an empty history)."""
    ev_feats, ev_group, hist_ts = tokens.ev_feats, tokens.ev_group, tokens.hist_ts
    if not len(hist_ts):
        ev_feats = np.zeros((1, tokens.cand_feats.shape[1]), np.int64)
        ev_group = np.zeros(1, np.int64)
        hist_ts = np.array([int(tokens.cand_ts.max()) + 1], np.int64)
    arrays = {"ev_feats": ev_feats.astype(np.int64), "ev_group": ev_group.astype(np.int64),
              "hist_ts": hist_ts.astype(np.int64), "cand_feats": tokens.cand_feats.astype(np.int64),
              "cand_ts": tokens.cand_ts.astype(np.int64)}
    if tokens.cand_cross.shape[1]:
        arrays[CROSS_INPUT] = tokens.cand_cross.astype(np.float32)
    return arrays


def torch_probs(student: Student, tokens: StudentTokens) -> np.ndarray:
    """The specification: Student.forward under serving conditions on the one-request batch."""
    with torch.no_grad():
        return torch.sigmoid(student(collate_student([tokens]), serving=True)["logits"].float()).numpy()


def _example(student: Student) -> tuple[torch.Tensor, ...]:
    """A request whose every dynamic length differs (and is > 1), so no dimension gets specialised."""
    from models.data import N_FIELDS, field_vocab, n_cross_features

    g = torch.Generator().manual_seed(0)
    vocab = torch.tensor(field_vocab(student.cfg.features))
    E, G, N = 11, 7, 5
    feats = lambda n: (torch.rand(n, N_FIELDS, generator=g) * (vocab - 1)).long() + 1  # noqa: E731
    group = torch.sort(torch.cat([torch.arange(G), torch.randint(0, G, (E - G,), generator=g)])).values
    hist_ts = torch.sort(torch.randint(0, 10 * 3_600_000, (G,), generator=g)).values
    example = (feats(E), group, hist_ts, feats(N), torch.full((N,), 11 * 3_600_000, dtype=torch.long))
    n_cross = n_cross_features(student.cfg.features)
    return example + ((torch.rand(N, n_cross, generator=g) * 3,) if n_cross else ())


def export_onnx(student: Student, path: str | os.PathLike) -> Path:
    """Export the student's serving path to ``path`` (one self-contained file); returns the path."""
    # onnx_ir and onnxscript load here, not with the module: every process that loads the code location
    # (run workers, code servers, `genrank` itself) imports this module, and they took ~1 s of its start-up
    import onnx_ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    path = Path(path)
    scorer = RequestScorer(student).eval()
    E, G, N = (torch.export.Dim(n, min=0) for n in ("events", "groups", "candidates"))
    shapes = {"ev_feats": {0: E}, "ev_group": {0: E}, "hist_ts": {0: G}, "cand_feats": {0: N}, "cand_ts": {0: N},
              CROSS_INPUT: {0: N}}
    names = input_names(student)
    with torch.no_grad():
        program = torch.onnx.export(scorer, _example(student), dynamo=True, input_names=names,
                                    output_names=[OUTPUT_NAME], dynamic_shapes={n: shapes[n] for n in names},
                                    opset_version=OPSET,
                                    external_data=False, verbose=False)
    # onnxscript's onnxruntime fusions: each RMSNorm's six nodes become one SimplifiedLayerNormalization
    # (max |diff| 6e-8 in probability; 5-9% of the graph's time on the 2-layer demo student).
    model, _ = optimize_for_ort(program.model)
    with staged_file(path) as staging:
        onnx_ir.save(model, str(staging))
    return path


def _providers() -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


class OnnxScorer:
    """An onnxruntime session over an exported student (CUDA provider when present, CPU otherwise).

    Denormal floats are flushed to zero on every thread that runs the graph: the attention's masked
    scores are -inf, and on this project's machines (Intel Xeon family 6 model 207, under KVM) every exp()
    that underflows (exp(-inf), or a softmax weight below 1e-38) takes a microcode assist: a masked softmax of
    2 x 523 x 324 scores took 0.81-0.91 ms instead of 0.20-0.27 ms, the whole graph 1.1-1.3x longer.
    Flushing changes no score (max |diff| 0 over the benchmark's requests): a denormal weight is far
    below float32's resolution of a softmax sum of 1."""

    def __init__(self, path: str | os.PathLike, threads: int = 0):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads  # 0 = onnxruntime's default (the physical cores)
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.set_denormal_as_zero", "1")  # onnxruntime's pool threads
        self.path = Path(path)
        self.session = ort.InferenceSession(str(path), opts, providers=_providers())
        torch.set_flush_denormal(False)  # the option also set the flags of the thread that built the session
        self.providers = self.session.get_providers()

    def score(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        # The calling thread runs the graph too and the session option does not reach it. Its flag is set for
        # this run only: left on, it would change the float maths of everything else on the thread.
        torch.set_flush_denormal(True)
        try:
            return self.session.run([OUTPUT_NAME], arrays)[0]
        finally:
            torch.set_flush_denormal(False)

    def score_tokens(self, tokens: StudentTokens) -> np.ndarray:
        return self.score(request_arrays(tokens))


@dataclass
class ParityReport:
    requests: int
    candidates: int
    max_abs_diff: float

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= PARITY_TOLERANCE


def parity(student: Student, scorer: OnnxScorer, requests: list[StudentTokens]) -> ParityReport:
    """Max |p_onnx - p_torch| over the requests' candidates and buckets (torch = Student.forward)."""
    worst, n = 0.0, 0
    for tokens in requests:
        if not len(tokens.cand_ts):
            continue
        diff = np.abs(scorer.score_tokens(tokens) - torch_probs(student, tokens))
        worst, n = max(worst, float(diff.max())), n + len(tokens.cand_ts)
    return ParityReport(len(requests), n, worst if n else float("nan"))   # nothing compared is not parity


def latency_p99_ms(scorer: OnnxScorer, requests: list[StudentTokens], repeats: int = 3) -> float:
    """p99 over requests of one request's ONNX scoring time (tokens ready, as the service holds them).
    Each request keeps its fastest of ``repeats`` runs, so a busy machine's hiccups do not decide a gate."""
    times = []
    for tokens in requests:
        arrays = request_arrays(tokens)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            scorer.score(arrays)
            best = min(best, time.perf_counter() - t)
        times.append(best * 1000)
    return float(np.percentile(times, 99)) if times else float("nan")   # nothing timed is not within budget


@dataclass
class ServingBundle:
    """What a serving host needs: the ONNX graph and the student config that tokenises its requests."""

    onnx: Path
    config: Path

    def student_config(self) -> StudentConfig:
        return from_dict(StudentConfig, json.loads(self.config.read_text())["student_config"])


def write_bundle(student: Student, folder: str | os.PathLike) -> ServingBundle:
    folder = Path(folder)
    onnx_path = export_onnx(student, folder / ONNX_FILE)
    cfg_path = folder / CONFIG_FILE
    with staged_file(cfg_path) as staging:
        staging.write_text(json.dumps({"student_config": to_dict(student.cfg), "inputs": input_names(student),
                                       "output": OUTPUT_NAME, "opset": OPSET}, indent=1))
    return ServingBundle(onnx_path, cfg_path)


def find_bundle(folder: str | os.PathLike) -> ServingBundle:
    """The bundle inside a downloaded model folder (MLflow nests artifacts)."""
    folder = Path(folder)
    found = {name: sorted(folder.rglob(name)) for name in (ONNX_FILE, CONFIG_FILE)}
    missing = [name for name, hits in found.items() if not hits]
    if missing:
        raise FileNotFoundError(f"{folder}: no {' / '.join(missing)} (a model logged before ONNX export existed?)")
    return ServingBundle(found[ONNX_FILE][0], found[CONFIG_FILE][0])
