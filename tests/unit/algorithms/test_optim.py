"""algorithms/optim.py: torch.optim.Adam's arithmetic bitwise, its state format both ways, no torch._dynamo."""

import copy
import subprocess
import sys

import torch

from algorithms.optim import Adam


def _parameters(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in ((5, 3), (3,), (3, 2))]


def _groups(params: list[torch.nn.Parameter]) -> list[dict]:
    return [{"params": params[:2], "weight_decay": 5e-4}, {"params": params[2:], "weight_decay": 0.0}]


def _train(optimizer, params: list[torch.nn.Parameter], steps: int) -> None:
    generator = torch.Generator().manual_seed(7)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=False)
        loss = sum((p * torch.randn(p.shape, generator=generator)).square().sum() for p in params)
        loss.backward()
        optimizer.step()


def test_the_updates_and_the_state_are_bitwise_torch_adams() -> None:
    ours, theirs = _parameters(1), _parameters(1)
    mine, reference = Adam(_groups(ours), lr=0.01), torch.optim.Adam(_groups(theirs), lr=0.01)
    _train(mine, ours, 25)
    _train(reference, theirs, 25)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    a, b = mine.state_dict(), reference.state_dict()
    assert [g["params"] for g in a["param_groups"]] == [g["params"] for g in b["param_groups"]]
    assert {k: v for k, v in a["param_groups"][0].items()} == b["param_groups"][0]
    assert all(torch.equal(a["state"][i][key], b["state"][i][key]) and a["state"][i][key].dtype == b["state"][i][key].dtype
               for i in b["state"] for key in b["state"][i])


def test_float64_parameters_in_one_group_update_bitwise_as_torch_adams() -> None:
    """What dgs's explainer (algorithms/policies/dgs_explainer.py) optimises: float64 logits, one group."""
    ours, theirs = ([torch.nn.Parameter(p.detach().double()) for p in _parameters(3)] for _ in range(2))
    mine, reference = Adam([{"params": ours}], lr=0.05), torch.optim.Adam(theirs, lr=0.05)
    _train(mine, ours, 20)
    _train(reference, theirs, 20)
    assert all(a.dtype == torch.float64 and torch.equal(a, b) for a, b in zip(ours, theirs))


def test_a_state_moves_between_the_two_and_training_goes_on_alike() -> None:
    ours, theirs = _parameters(2), _parameters(2)
    reference = torch.optim.Adam(_groups(theirs), lr=0.02)
    _train(reference, theirs, 3)
    with torch.no_grad():
        for a, b in zip(ours, theirs):
            a.copy_(b)
    # deep copies, as a checkpoint's save and load make them (both state_dict()s hand out their live tensors)
    mine = Adam(_groups(ours), lr=0.5)
    mine.load_state_dict(copy.deepcopy(reference.state_dict()))  # the learning rate comes with the state
    back = torch.optim.Adam(_groups(theirs), lr=0.5)
    back.load_state_dict(copy.deepcopy(mine.state_dict()))
    _train(mine, ours, 4)
    _train(back, theirs, 4)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_it_does_not_import_torch_dynamo() -> None:
    code = ("import sys, torch\nfrom algorithms.optim import Adam\np = torch.nn.Parameter(torch.ones(3))\n"
            "o = Adam([{'params': [p]}], lr=0.1)\np.sum().backward()\no.step()\no.zero_grad()\n"
            "print('torch._dynamo' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stdout + result.stderr
