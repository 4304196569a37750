"""Tiny configs shared by the models tests (imported via the sys.path entry conftest adds)."""
from models.config import BackboneConfig, FeatureConfig, StudentConfig, TeacherConfig


def tiny_features() -> FeatureConfig:
    return FeatureConfig(item_buckets=512, campaign_buckets=64, advertiser_buckets=32, category_buckets=32,
                         brand_buckets=32, surface_buckets=8, device_buckets=8, max_position=10, dwell_buckets=8,
                         item_stats=True)   # the models tests cover the item statistics' path, off where the pipeline trains


def tiny_backbone(**kw) -> BackboneConfig:
    base = dict(d_model=32, n_layers=2, n_heads=2, attn_backend="reference", attn_chunk=64)
    base.update(kw)
    return BackboneConfig(**base)


def tiny_teacher(**kw) -> TeacherConfig:
    return TeacherConfig(features=tiny_features(), backbone=tiny_backbone(**kw.pop("backbone", {})), max_len=kw.pop("max_len", 256), **kw)


def tiny_student(**kw) -> StudentConfig:
    return StudentConfig(features=tiny_features(), backbone=tiny_backbone(**kw.pop("backbone", {})), max_len=kw.pop("max_len", 64), **kw)


def ddp_worker(rank: int, world: int, port: int, data_dir: str, out_dir: str, kind: str, budget: int, steps: int):
    """One rank of the DDP test (module-level so torch.multiprocessing.spawn can pickle it)."""
    import json
    import os

    import torch
    import torch.distributed as dist

    from models.config import TrainConfig
    from models.train import train_student, train_teacher

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        tc = TrainConfig(lr=3e-3, token_budget=budget, epochs=5, max_steps=steps, log_every=1000, warmup_steps=2, seed=0, device="cpu")
        res = (train_teacher(data_dir, tiny_teacher(), tc) if kind == "teacher"
               else train_student(data_dir, None, tiny_student(), tc))
        if rank == 0:
            sd = {k: v.double().sum().item() for k, v in res.model.state_dict().items()}
            with open(os.path.join(out_dir, "result.json"), "w") as f:
                json.dump({"loss": [h["loss"] for h in res.history], "params": sd}, f)
    finally:
        dist.destroy_process_group()
