"""The PyTorch/XLA trainer's small parts: the learning-rate schedule (pure Python) and the weight digest
(torch, in the backend's venv: the digest is what tells that data-parallel replicas ended with identical
weights)."""

from __future__ import annotations

import json
import math
import subprocess
import textwrap

import pytest

from tpuft.worker.schedule import lr_factor
from tpuft.worker.torch_xla.train import rng_seed


def test_linear_warm_up_then_linear_decay_to_zero() -> None:
    factor = lr_factor(steps=100, warmup=10, schedule="linear")
    assert [round(factor(s), 3) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert factor(10) == 1.0 and factor(55) == pytest.approx(0.5) and factor(100) == 0.0
    assert all(factor(s) >= factor(s + 1) for s in range(10, 100))


def test_constant_after_warm_up_and_no_warm_up() -> None:
    assert [lr_factor(50, 5, "constant")(s) for s in (0, 4, 5, 49)] == [0.2, 1.0, 1.0, 1.0]
    plain = lr_factor(4, 0, "linear")
    assert [plain(s) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]


def test_rng_seeds_differ_by_seed_replica_and_step_and_fit_every_generator() -> None:
    """Each replica reseeds from (seed, replica, step) at every checkpoint step: replicas must draw different
    dropout masks, and each checkpoint step starts a stream of its own."""
    seeds = [
        rng_seed(seed, replica, step) for seed in (0, 1) for replica in range(4) for step in (0, 4, 8, 4000)
    ]
    assert len(set(seeds)) == len(seeds) == 32
    assert all(0 <= seed < 2**63 for seed in seeds)  # torch.manual_seed and the XLA RNG take any of these


DIGESTS = textwrap.dedent(
    """
    import json, torch
    from tpuft.worker.torch_xla.train import params_digest
    torch.manual_seed(0)
    state = {"encoder.w": torch.randn(4, 3), "decoder.b": torch.randn(3), "shared": torch.randn(2, 2)}
    base = params_digest(state)
    out = {"same": params_digest({k: v.clone() for k, v in state.items()}) == base, "changed": []}
    for name in state:  # one element of any tensor, by the smallest float32 step
        other = {k: v.clone() for k, v in state.items()}
        flat = other[name].view(-1)
        flat[-1] = torch.nextafter(flat[-1], torch.tensor(float("inf")))
        out["changed"].append(params_digest(other) != base)
    out["reshaped"] = params_digest({**state, "shared": state["shared"].reshape(4)}) != base
    out["renamed"] = params_digest({("x" + k): v for k, v in state.items()}) != base
    out["dtype"] = params_digest({**state, "decoder.b": state["decoder.b"].double()}) != base
    out["empty"] = params_digest({}) not in (base, params_digest({"shared": torch.empty(0)}))
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_the_weight_digest_changes_with_any_weight(torch_python: str) -> None:
    from tests.conftest import REPO

    out = subprocess.run(
        [torch_python, "-c", DIGESTS],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {
        "same": True,
        "changed": [True, True, True],
        "reshaped": True,
        "renamed": True,
        "dtype": True,
        "empty": True,
    }


def test_cosine_after_warm_up_is_half_a_cosine_to_zero() -> None:
    factor = lr_factor(steps=110, warmup=10, schedule="cosine")
    assert [round(factor(s), 3) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert factor(10) == 1.0 and factor(60) == pytest.approx(0.5) and factor(110) == pytest.approx(0.0)
    assert factor(35) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert all(factor(s) >= factor(s + 1) for s in range(10, 110))


LOSS = textwrap.dedent(
    """
    import json, torch
    from tpuft.worker.torch_xla.parts import token_loss_sum
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, dtype=torch.bfloat16)
    labels = torch.tensor([[1, 4, -100], [0, -100, -100]])
    logp = torch.log_softmax(logits.float(), -1)
    out = {}
    for eps in (0.0, 0.1):
        manual = sum(-(1 - eps) * logp[b, t, labels[b, t]] - eps * logp[b, t].mean()
                     for b in range(2) for t in range(3) if labels[b, t] != -100)
        out[str(eps)] = [float(token_loss_sum(logits, labels, eps)), float(manual)]
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_the_loss_is_summed_over_real_tokens_in_float32_with_label_smoothing(torch_python: str) -> None:
    """Padding (-100) does not count, bf16 logits are scored in float32, and label smoothing spreads eps over
    the vocabulary as torch's cross-entropy defines it."""
    from tests.conftest import REPO

    out = subprocess.run(
        [torch_python, "-c", LOSS],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for ours, manual in result.values():
        assert ours == pytest.approx(manual, rel=1e-6)
    assert result["0.1"][0] != pytest.approx(result["0.0"][0], rel=1e-3)
