"""cluster.yaml is a valid Ray cluster-launcher config (the installed Ray's schema) with what the sweeps need."""

import json
from pathlib import Path

import jsonschema
import ray
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from sweeps.config import load_sweep

REPO = Path(__file__).resolve().parents[2]


def cluster() -> dict:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def test_valid_against_rays_schema_as_written_and_as_ray_up_fills_it():
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(cluster(), schema)
    validate_config(prepare_config(cluster()))  # what `ray up` does before launching anything


def test_cpu_head_gpu_workers_and_autoscaling():
    config = cluster()
    assert config["provider"]["type"] == "aws"
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert not head["node_config"]["InstanceType"].startswith(("p", "g")) and not head["resources"].get("GPU")
    (worker,) = (t for n, t in types.items() if n != config["head_node_type"])
    assert worker["node_config"]["InstanceType"] in ("p4d.24xlarge", "p5.48xlarge")
    assert worker["resources"]["GPU"] == 8
    assert worker["min_workers"] == 0 < worker["max_workers"] <= config["max_workers"]
    assert config["idle_timeout_minutes"] > 0


def test_cuda_image_matches_installed_ray_and_python():
    image = cluster()["docker"]["image"]
    assert image.startswith(f"rayproject/ray:{ray.__version__}-py3")
    assert image.endswith(("-gpu", "-cu121", "-cu124", "-cu128")) and ("-py311-" in image or "-py312-" in image)


def test_project_installed_and_dashboard_on_the_head():
    config = cluster()
    (remote, local), = config["file_mounts"].items()
    assert local == "." and any(f"pip install -e {remote}" in c for c in config["setup_commands"])
    start = " ".join(config["head_start_ray_commands"])
    assert "ray start --head" in start and "--dashboard-host=0.0.0.0" in start and "--dashboard-port=8265" in start
    assert any("--address=$RAY_HEAD_IP:6379" in c for c in config["worker_start_ray_commands"])


def test_paper_sweeps_store_results_on_the_shared_mount():
    config = cluster()
    mount = next(o.split()[1].split(":")[1] for o in config["docker"]["run_options"] if o.startswith("-v "))
    assert any(mount in c and "mount" in c for c in config["initialization_commands"])
    gpus = sum(t.get("max_workers", 0) * t.get("resources", {}).get("GPU", 0)
               for t in config["available_node_types"].values())
    for name in ("alpaca", "tulu3", "openhermes"):
        sweep = load_sweep(REPO / "sweeps" / "configs" / f"paper_{name}.yaml")
        assert sweep.results_dir.startswith(mount + "/")
        # the cluster's GPUs hold that many trials of the widest layout (two GPUs: the 7-8B families)
        widest = max(sweep.layout(family).workers for family in sweep.families)
        assert sweep.resources.max_concurrent_trials == gpus // widest
