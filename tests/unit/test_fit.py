"""The dry run (cluster.fit): it refuses the 7B DDP configuration with its per-GPU figures and
accepts the sharded one against the shipped KubeRay manifests; unmounted paths, GPUs beyond
the manifest and a /dev/shm too small for the transport are refused; its parameter counter
equals the real models' numel and its activation figures equal what autograd saves."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from benchmarks.activation_memory import saved_bytes
from cluster.config import JobConfig
from cluster.fit import (ACTIVATION_FIT, ModelShape, activation_bytes, card_gib,
                         check, cluster_from_manifests, dry_run, trainer_memory)
from consolerl.config import load_config
from consolerl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DDP = str(ROOT / "tests/data/gpu-cluster-ddp.yaml")
SHIPPED = str(ROOT / "configs/gpu-cluster.yaml")
SEVEN_B = str(ROOT / "configs/models/7b/config.json")
ARGS = ["--model-config", SEVEN_B, "--gpu-gib", "79.6"]


def _rows(path: str, overrides: tuple[str, ...] = ()):
    config = load_config(JobConfig, path, list(overrides))
    cluster = cluster_from_manifests(["cluster/deploy/raycluster.yaml",
                                      "cluster/deploy/volumes.yaml"], 79.6, "test")
    return check(config, ModelShape.from_config(SEVEN_B), cluster)


def _refused(rows):
    return [r for r in rows if r.ok is False]


def test_the_7b_ddp_config_is_refused_with_its_per_gpu_figures(capsys):
    assert dry_run([*ARGS, "--config", DDP]) == 2
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("REFUSED: trainer ("))
    # Every rank holds fp32 weights, fp32 gradients, DDP's bucket copy, AdamW's two fp32
    # states and autocast's bf16 copy: 22 bytes x 7.62e9 parameters = 156 GiB before
    # activations.
    assert "ddp/4, bfloat16" in line and "7.62B params" in line
    need = float(re.search(r": ([\d.]+) GiB per GPU > 79.6 GiB", line).group(1))
    assert need > 156
    for part in ("weights 28.4", "gradients 28.4", "optimizer 56.7", "ddp_bucket 28.4",
                 "bf16_copy 14.2"):
        assert part in line
    # Only the trainer's memory is wrong with it: everything else fits the manifests.
    assert [r.check.split(" (")[0] for r in _refused(_rows(DDP))] == ["trainer"]


def test_the_shipped_gpu_config_fits_the_shipped_manifests(capsys):
    from cluster.job import main
    assert main(["--config", SHIPPED, "--dry-run", *ARGS]) == 0
    out = capsys.readouterr().out
    assert "fsdp2/4, bfloat16" in out and "REFUSED" not in out and out.rstrip().endswith("fits")
    rows = _rows(SHIPPED)
    trainer = next(r for r in rows if r.check.startswith("trainer ("))
    assert trainer.need < 0.75 * trainer.limit          # room for what the model leaves out
    assert all(r.ok for r in rows), [r for r in rows if not r.ok]


def test_json_output_is_one_object(capsys):
    assert dry_run([*ARGS, "--config", DDP, "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["params"] == 7_615_616_512
    assert doc["refused"][0].startswith("trainer (ddp/4")


def test_a_checkpoint_dir_the_gpu_pods_do_not_mount_is_refused():
    rows = _rows(SHIPPED, ("trainer.checkpoint.dir=/data/ckpt",))
    [bad] = _refused(rows)
    assert bad.check == "mount: trainer.checkpoint.dir /data/ckpt"
    assert "not mounted in gpus (GPU pods (trainer ranks write))" in bad.detail
    assert "not mounted in head (head (driver reads on --resume))" in bad.detail


def test_a_relative_run_dir_is_refused_on_a_cluster():
    rows = _rows(SHIPPED, ("run.dir=runs/x",))
    assert {r.check for r in _refused(rows)} == {"mount: run.dir",
                                                 "mount: final model (run.dir/final)"}


def test_gpus_beyond_the_manifest_are_refused():
    [bad] = _refused(_rows(SHIPPED, ("policy.replicas=6",)))
    assert bad.check == "GPUs" and (bad.need, bad.limit) == (10, 8)
    [bad] = _refused(_rows(SHIPPED, ("policy.tensor_parallel_size=2", "policy.num_gpus_per_replica=2")))
    assert bad.check == "GPUs" and (bad.need, bad.limit) == (12, 8)


def test_a_judge_served_in_the_cluster_is_one_more_replica():
    rows = _rows(SHIPPED, ("reward.judges.enabled=true", "reward.judges.endpoint=policy:default",
                           "policy.replicas=4"))
    [bad] = _refused(rows)
    assert bad.check == "GPUs" and (bad.need, bad.limit) == (9, 8) and "the judge" in bad.detail
    # A remote judge takes nothing here.
    assert not _refused(_rows(SHIPPED, ("reward.judges.enabled=true", "policy.replicas=4")))


def test_object_store_weights_need_more_dev_shm_than_the_manifest_gives():
    [bad] = _refused(_rows(SHIPPED, ("trainer.weights.transport=object_store",)))
    # The 24 GiB store plus one 14.2 GiB file per replica on the node (4) plus 1 for NCCL.
    assert bad.check.startswith("/dev/shm per GPU node")
    assert bad.need == pytest.approx(24 + 4 * 7_615_616_512 * 2 / 2**30 + 1)
    assert bad.limit == 48


def test_the_manifests_parse_and_agree_with_the_config():
    docs = {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d]
            for p in (ROOT / "cluster/deploy").glob("*.yaml")}
    assert all(docs.values())
    job = docs["rayjob.yaml"][0]["spec"]["entrypoint"]
    assert "--config configs/gpu-cluster.yaml --dry-run" in job and "--resume" in job
    cluster = cluster_from_manifests(["cluster/deploy/raycluster.yaml",
                                      "cluster/deploy/volumes.yaml"], 79.6, "")
    config = load_config(JobConfig, SHIPPED)
    gpus = config.trainer.engine.workers + config.policy.replicas
    assert cluster.gpus == gpus == 8 and cluster.gpu_pods == 1
    claims = {v.claim for g in (cluster.head, *cluster.gpu_groups) for v in g.mounts.values()
              if v.claim}
    assert claims <= set(cluster.claims)               # every claim mounted is defined


def test_the_image_pins_agree_with_the_project():
    docker = (ROOT / "cluster/deploy/Dockerfile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    makefile = (ROOT / "Makefile").read_text()
    torch_pin = re.search(r'"torch==([\d.]+)"', pyproject).group(1)
    assert set(re.findall(r"torch==([\d.]+)", docker)) == {torch_pin}
    vllm = re.search(r"VLLM_VERSION := ([\d.]+)", makefile).group(1)
    assert re.findall(r"vllm==([\d.]+)", docker) == [vllm]
    assert re.search(r'"ray\[default,serve\]==([\d.]+)"', pyproject).group(1) in docker
    apt = re.findall(r"apt-get install[^&]*", docker)
    assert apt and not any("chromium" in line for line in apt)   # Ubuntu's is a snap shim
    assert "playwright install --with-deps chromium" in docker
    assert load_config(JobConfig, SHIPPED).policy.vllm_python == "/opt/vllm/bin/python"
    assert "python -m venv /opt/vllm" in docker


def test_an_unknown_architecture_is_refused_by_name(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 768}))
    with pytest.raises(ConfigError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        ModelShape.from_config(path)


def test_the_gpu_default_is_stated():
    gib, note = card_gib(None)
    assert gib > 0 and ("assumed" in note or "GiB" in note)


# -- the counter and the activation figures, against real models ------------------------------

def test_the_parameter_count_of_the_tiny_default_model_is_its_numel():
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from rollout_service.models import resolve_model
    path = resolve_model("")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    numel = sum(p.numel() for p in model.parameters())           # tied weights counted once
    assert ModelShape.from_config(Path(path) / "config.json").params == numel


@pytest.mark.parametrize("cfg", [
    SEVEN_B,
    {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 96,
     "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 6,
     "num_key_value_heads": 2, "vocab_size": 300, "attention_bias": True, "mlp_bias": True},
    {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
     "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 1, "vocab_size": 256, "head_dim": 32},
    {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
     "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
     "num_key_value_heads": 2, "vocab_size": 256, "head_dim": 32,
     "tie_word_embeddings": True},
])
def test_the_parameter_count_matches_transformers(cfg, tmp_path):
    """On the meta device: the 7B model's shape costs no memory."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM
    if isinstance(cfg, dict):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(cfg))
    else:
        path = Path(cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path.parent))
    assert ModelShape.from_config(path).params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("mode", ["autocast", "bf16", "fp32"])
def test_activation_bytes_per_layer_match_what_autograd_saves(mode):
    """The fitted bytes per token and layer of the dry run, measured again on a Llama shape it
    was not fitted on: the growth from 2 to 4 layers and from 128 to 256 tokens (the weights'
    bf16 copies, which do not grow with tokens, drop out)."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    h, inter, kv_heads = 448, 1216, 1
    saved = {}
    for layers in (2, 4):
        config = LlamaConfig(hidden_size=h, intermediate_size=inter, num_attention_heads=7,
                             num_key_value_heads=kv_heads, head_dim=64,
                             num_hidden_layers=layers, vocab_size=512)
        config._attn_implementation = "sdpa"
        dtype = torch.bfloat16 if mode == "bf16" else torch.float32
        model = LlamaForCausalLM(config).to(dtype).train()
        for tokens in (128, 256):
            saved[layers, tokens] = saved_bytes(model, tokens, autocast=mode == "autocast")
    per_token_layer = ((saved[4, 256] - saved[2, 256]) - (saved[4, 128] - saved[2, 128])) \
        / 2 / 128
    (a, b, c), _ = ACTIVATION_FIT[mode]
    assert per_token_layer == pytest.approx(a * h + b * kv_heads * 64 + c * inter, rel=0.01)


def test_fsdp2_divides_the_states_and_checkpointing_shrinks_activations():
    shape = ModelShape.from_config(SEVEN_B)
    base = load_config(JobConfig, SHIPPED)
    parts = trainer_memory(shape, base, 1024)
    assert parts["weights"] == pytest.approx(4 * shape.params / 4)
    assert parts["optimizer"] == pytest.approx(8 * shape.params / 4)
    no_ckpt = load_config(JobConfig, SHIPPED, ["trainer.engine.gradient_checkpointing=false"])
    assert (sum(activation_bytes(shape, no_ckpt, 1024).values())
            > 5 * sum(activation_bytes(shape, base, 1024).values()))
