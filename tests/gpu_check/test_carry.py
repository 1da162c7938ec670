"""What travels to the lent GPU machine: the size check, Ray's cut-down wheel, the torch API scan
and the verdict over the check's JSON (benchmarks/gpu_carry.py, torch_api.py, gpu_check_verdict.py).

Real git repositories, real wheels installed by the real pip; nothing here needs a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

MiB = 1 << 20


def _git_repo(root: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("/.gpu_wheels/\n/.venv/\n")
    (root / "tracked.bin").write_bytes(b"t" * MiB)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    (root / "untracked.bin").write_bytes(b"u" * (2 * MiB))  # travels: not ignored
    (root / ".venv").mkdir()
    (root / ".venv" / "big.bin").write_bytes(b"v" * (5 * MiB))  # ignored: stays behind
    (root / ".gpu_wheels").mkdir()
    (root / ".gpu_wheels" / "w.whl").write_bytes(b"w" * (3 * MiB))  # ignored, but carried
    return root


def test_size_check_counts_what_travels_and_fails_over_the_limit(tmp_path, bench):
    carry = bench("gpu_carry")
    repo = _git_repo(tmp_path / "repo")
    gitignore = len((repo / ".gitignore").read_bytes())
    report = carry.carry_report(repo, [repo / ".gpu_wheels"], limit=7 * MiB)
    assert report["working_tree"] == 3 * MiB + gitignore  # tracked + untracked, not .venv
    assert report["carried"] == {".gpu_wheels": 3 * MiB}
    assert report["total"] == 6 * MiB + gitignore and report["fits"]
    (repo / "shared").mkdir()  # a checkout's shared/ travels even where git ignores it
    (repo / "shared" / "notes.bin").write_bytes(b"s" * (2 * MiB))
    (repo / ".gitignore").write_text("/.gpu_wheels/\n/.venv/\n/shared/\n")
    over = carry.carry_report(repo, [repo / ".gpu_wheels"], limit=7 * MiB)
    assert not over["fits"] and over["headroom"] < -MiB
    # the command line says so and exits 1 at the real 64 MiB limit
    (repo / ".gpu_wheels" / "ray.whl").write_bytes(b"r" * (60 * MiB))
    done = subprocess.run([sys.executable, str(carry.__file__), "size", str(repo), str(repo / ".gpu_wheels")],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "over the limit by" in done.stderr


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    dist = "ray-2.60.0.dist-info"
    files = {**files,
             f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: ray\nVersion: 2.60.0\n",
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist}/RECORD", record)
    return path


def test_ray_wheel_loses_the_unused_parts_and_pip_installs_what_is_left(tmp_path, bench):
    carry = bench("gpu_carry")
    wheel = _wheel(tmp_path / "ray-2.60.0-py3-none-any.whl", {
        "ray/__init__.py": b"VERSION = '2.60.0'\n",
        "ray/_private/worker.py": b"",
        "ray/jars/ray_dist.jar": b"j" * 100_000,
        "ray/rllib/__init__.py": b"",
        "ray/dashboard/client/build/index.html": b"<html>",
        "ray/dashboard/head.py": b""})
    before, after = carry.prune_wheel(wheel)
    assert after < before
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        record = zf.read("ray-2.60.0.dist-info/RECORD").decode()
    assert "ray/jars/ray_dist.jar" not in names and "ray/rllib/__init__.py" not in names
    assert "ray/dashboard/client/build/index.html" not in names
    assert {"ray/__init__.py", "ray/_private/worker.py", "ray/dashboard/head.py"} <= names
    assert "jars" not in record and "rllib" not in record and "ray/dashboard/head.py" in record
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                    str(site), str(wheel)], check=True)
    assert (site / "ray" / "__init__.py").read_text() == "VERSION = '2.60.0'\n"
    assert not (site / "ray" / "jars").exists()


def test_torch_api_scan_names_what_the_installed_torch_lacks(tmp_path, bench):
    api = bench("torch_api")
    source = tmp_path / "uses_torch.py"
    source.write_text(
        "import torch\nimport torch.distributed as dist\nfrom torch.nn import functional\n"
        "x = torch.nn.functional.softmax(torch.ones(2), dim=0)\n"
        "y = torch.not_in_any_release.fancy(x)\n"
        "z = torch.ones(2).sum()\n")
    assert api.torch_names(source.read_text()) == {
        "torch", "torch.distributed", "torch.nn.functional", "torch.nn.functional.softmax",
        "torch.not_in_any_release.fancy", "torch.ones"}
    result = api.check([source])
    assert list(result["missing"]) == ["torch.not_in_any_release.fancy"]
    assert result["names"] == 6


def _stage_files(out: Path, engines: dict, tiny_steps: int = 4, sglang: dict | None = None) -> None:
    ok = {"ok": True}
    first = {"device": "cpu", "torch_api": {**ok, "names": 120, "missing": {}}, "engines": {**ok, **engines},
             "megatron": {**ok, "float32_logprob_max_abs_diff": 1e-6},
             "transfer": {**ok, "rows": [{"method": "memcpy (limit)"}, {"method": "mesh shm"}]}}
    ray = {"device": "cpu", "tiny_run": {**ok, "steps": tiny_steps},
           "sglang_run": {**ok, **(sglang or {"colocated": {"steps": 4}, "disaggregated": {"steps": 4}})}}
    out.mkdir(exist_ok=True)
    (out / "first.json").write_text(json.dumps(first))
    (out / "ray.json").write_text(json.dumps(ray))


def test_verdict_passes_only_what_each_part_exists_to_show(tmp_path, bench):
    verdict = bench("gpu_check_verdict").verdict
    audits = {"train_offloaded": 100, "train_onloaded": 100, "rollout_offloaded": 50, "rollout_onloaded": 50}
    engines = {"tensors_checked": {**audits, "train_tensors_on_meta": 100, "rollout_tensors_on_meta": 50},
               "generated_tokens": 16, "logprob_abs_diff_max": 1e-6, "offload_frees_device": False,
               "memory_bytes": {}}
    _stage_files(tmp_path, engines)
    assert all(not problems for problems in verdict(tmp_path).values())
    # the dry run saw fewer tensors than the audit, the run trained 3 steps, SGLang was skipped
    _stage_files(tmp_path, {**engines, "tensors_checked": {**audits, "train_tensors_on_meta": 99,
                                                           "rollout_tensors_on_meta": 50}},
                 tiny_steps=3, sglang={"skipped": "sglang is not installed"})
    failed = {name: problems for name, problems in verdict(tmp_path).items() if problems}
    assert set(failed) == {"engines", "tiny_run", "sglang_run"}
    assert "dry run saw 99 train tensors" in failed["engines"][0]
    (tmp_path / "ray.json").unlink()  # a stage that timed out before writing anything
    assert verdict(tmp_path)["tiny_run"] == ["did not run (no ray.json entry)"]
