"""PyTorch/XLA Multislice pieces: the HybridMesh shapes and device order (pure, and against torch_xla's own
``HybridMesh`` with stand-in TPU device attributes), the ``('data', 'fsdp')`` mesh's batch and weight
shardings (on CPU devices), the libtpu start-up bound, and on the CPU pod the gloo rendezvous bounded by
``train.startup_timeout`` and the hierarchical (within slice, then across slices) reduction."""

from __future__ import annotations

import itertools
import json
import subprocess

import pytest

from tests.conftest import REPO
from tpuft.core.records import SliceLayout
from tpuft.worker.torch_xla.multislice import (
    hybrid_device_order,
    mesh_line,
    mesh_shape,
    outer_slices_problem,
)


def stand_in_devices(slices: int, dims: tuple[int, int, int]) -> list[tuple[int, tuple[int, int, int]]]:
    """(slice_index, coords) per device ordinal, as a TPU runtime numbers them: slice by slice, x fastest."""
    return [
        (s, (x, y, z))
        for s in range(slices)
        for z, y, x in itertools.product(range(dims[2]), range(dims[1]), range(dims[0]))
    ]


def test_mesh_shapes_put_the_slices_on_the_outer_data_axis() -> None:
    data = mesh_shape(slices=2, devices=16, fsdp=False)
    assert (data.axis_names, data.ici_mesh_shape, data.dcn_mesh_shape, data.mesh_shape) == (
        ("data",),
        (8,),
        (2,),
        (16,),
    )
    fsdp = mesh_shape(slices=4, devices=64, fsdp=True)
    assert (fsdp.axis_names, fsdp.ici_mesh_shape, fsdp.dcn_mesh_shape, fsdp.mesh_shape) == (
        ("data", "fsdp"),
        (1, 16),
        (4, 1),
        (4, 16),
    )
    with pytest.raises(ValueError, match="do not split into 3 equal slices"):
        mesh_shape(slices=3, devices=16, fsdp=False)


def test_device_order_is_slice_by_slice_then_the_torus_and_the_check_names_a_mixed_block() -> None:
    # HybridMesh's own order for 2 slices of v4-8 (2x2x1) and of v4-16 (2x2x2), as torch_xla 2.9 gives it
    assert hybrid_device_order(stand_in_devices(2, (2, 2, 1))) == [0, 2, 1, 3, 4, 6, 5, 7]
    assert hybrid_device_order(stand_in_devices(2, (2, 2, 2)))[:8] == [0, 4, 2, 6, 1, 5, 3, 7]
    # slices interleaved by ordinal
    shuffled = [
        (1, (0, 0, 0)),
        (0, (1, 0, 0)),
        (1, (1, 0, 0)),
        (0, (0, 0, 0)),
    ]
    order = hybrid_device_order(shuffled)
    assert order == [3, 1, 0, 2]
    slice_of = [s for s, _ in shuffled]
    assert outer_slices_problem(order, slice_of, 2) is None
    assert outer_slices_problem([0, 1, 2, 3], slice_of, 2) == (
        "block 0 of the mesh's outer axis holds devices of slices [0, 1], not slice 0 alone"
    )


def test_the_trainer_logs_its_mesh_slices_outer() -> None:
    assert mesh_line(SliceLayout(2, 1), 1, ("data",)) == "mesh: slices 2 x hosts 1 x devices 1 (data)"


VENV_PROBE = r"""
import itertools, json, multiprocessing, socket, sys
import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.distributed.spmd.xla_sharding as xsh
import torch_xla.runtime as xr
from tpuft.core.records import SliceLayout
from tpuft.worker.torch_xla.multislice import hybrid_device_order, mesh_shape
from tpuft.worker.torch_xla.replicas import Gloo, rendezvous
from tpuft.worker.torch_xla.sharding import batch_to_device, shard_parameters

out = {}

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def member(rank, layout, coordinator, queue):
    try:
        gloo = Gloo(rank, layout, coordinator, "cpu", 30.0)
        total = gloo.sum(torch.tensor([rank + 1.0, 10.0 ** rank], dtype=torch.float64))
        queue.put((rank, [float(v) for v in total], len(gloo.groups)))
        gloo.close()
    except BaseException as exc:
        queue.put((rank, repr(exc), -1))

# 1. the CPU pod's gloo: 2 slices x 2 hosts (forked before the XLA runtime starts), and a slice that never comes
context = multiprocessing.get_context("fork")
layout, queue, coordinator = SliceLayout(2, 2), context.Queue(), f"127.0.0.1:{free_port()}"
members = [context.Process(target=member, args=(r, layout, coordinator, queue)) for r in range(4)]
for p in members: p.start()
out["sums"] = sorted(queue.get(timeout=120) for _ in members)
for p in members: p.join(30)
try:
    rendezvous(f"127.0.0.1:{free_port()}", 0, SliceLayout(2, 1), 1.5)
except RuntimeError as exc:
    out["timeout"] = str(exc)

# 2. the ('data', 'fsdp') mesh of several slices, on 4 CPU devices (CPU_NUM_DEVICES): batch and weights
xr.use_spmd()
mesh = xs.Mesh(np.arange(4), (2, 2), ("data", "fsdp"))
batch, = batch_to_device(mesh, torch_xla.device(), (torch.arange(16.0).reshape(8, 2),))
layer = torch.nn.Linear(8, 6).to(torch_xla.device())
out["fsdp"] = {"specs": list(shard_parameters(mesh, list(layer.named_parameters())).values()),
               "batch": torch_xla._XLAC._get_xla_sharding_spec(batch),
               "weight": torch_xla._XLAC._get_xla_sharding_spec(layer.weight), "sum": float(batch.sum())}

# 3. HybridMesh's own order with stand-in TPU attributes (slice_index, coords)
out["meshes"] = []
xm.xla_device_hw = lambda device: "TPU"  # HybridMesh's torus code asks; the attributes below stand in for TPU's
for slices, dims, fsdp in json.loads(sys.argv[1]):
    devices = [(s, c) for s in range(slices) for c in
               [(x, y, z) for z, y, x in itertools.product(range(dims[2]), range(dims[1]), range(dims[0]))]]
    attributes = [{"name": f"TPU:{i}", "slice_index": s, "coords": list(c), "core_on_chip": 0}
                  for i, (s, c) in enumerate(devices)]
    xr.global_runtime_device_attributes = lambda a=attributes: [dict(d) for d in a]
    xr.global_runtime_device_count = lambda a=attributes: len(a)
    shape = mesh_shape(slices=slices, devices=len(devices), fsdp=fsdp)
    hybrid = xsh.HybridMesh(ici_mesh_shape=shape.ici_mesh_shape, dcn_mesh_shape=shape.dcn_mesh_shape,
                            axis_names=shape.axis_names)
    out["meshes"].append({"theirs": [int(d) for d in hybrid.device_ids], "ours": hybrid_device_order(devices),
                          "shape": list(hybrid.mesh_shape), "expected_shape": list(shape.mesh_shape)})
print(json.dumps(out))
"""  # noqa: E501 (a script run in another interpreter)


@pytest.mark.slow
@pytest.mark.backend_venvs("torch_xla")
def test_hybrid_mesh_order_and_the_gloo_pod_in_the_backend_venv(torch_python: str) -> None:
    cases = [[2, [2, 2, 1], False], [2, [2, 2, 2], True], [4, [2, 2, 4], True], [2, [4, 4, 1], False]]
    done = subprocess.run(
        [torch_python, "-c", VENV_PROBE, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={
            "PYTHONPATH": str(REPO),
            "PATH": "/usr/bin:/bin",
            "PJRT_DEVICE": "CPU",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "CPU_NUM_DEVICES": "4",
        },
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for mesh in out["meshes"]:
        assert mesh["theirs"] == mesh["ours"] and mesh["shape"] == mesh["expected_shape"], mesh
    # 2 slices x 2 hosts: each rank adds (rank + 1, 10**rank); within the slice, then across: every rank has
    # the sum
    assert out["sums"] == [[r, [10.0, 1111.0], 2] for r in range(4)], out["sums"]
    # several slices with FSDP: the batch over both axes (4 devices), the weights split on fsdp, replicated on
    # data
    assert out["fsdp"] == {
        "specs": [[None, "fsdp"]],
        "batch": "{devices=[4,1]0,1,2,3}",
        "weight": "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}",
        "sum": 120.0,
    }, out["fsdp"]
    assert out["timeout"].startswith(
        "1 of 2 workers never joined the run's rendezvous within train.startup_timeout "
        "(1.5 s): slice 1 host 0 (worker 1)"
    ), out["timeout"]
