"""False-positive classes found on real repositories (bench/precision.py), each as a small fixture in our
own words: the finding must go away where the code gives no reason for it, and stay where it does."""

from xlaport.kb import lint_source


def codes(source: str) -> set[str]:
    return {f.code for f in lint_source(source)}


# --- not-on-device: a script that names no device trains on the CPU ------------------------------
CPU_SCRIPT = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
for epoch in range(3):
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(loss.item())
        preds = model(x).detach().numpy()
torch.save(model.state_dict(), "model.ckpt")
model.load_state_dict(torch.load("model.ckpt"))
"""
DEVICE_CODES = {"XLA206", "XLA221", "XLA307", "XLA401", "XLA404", "XLA408", "XLA414", "XLA701"}


def test_a_script_that_names_no_device_gets_no_device_findings():
    assert not codes(CPU_SCRIPT) & DEVICE_CODES


def test_the_same_script_moved_to_cuda_gets_them():
    on_gpu = CPU_SCRIPT.replace("model = nn.Linear(3, 1)", "model = nn.Linear(3, 1).to('cuda')")
    assert {"XLA206", "XLA307", "XLA401", "XLA408", "XLA414", "XLA701"} <= codes(on_gpu)


def test_a_library_module_without_a_device_keeps_its_findings():
    # no script: the caller may hand it device tensors
    library = "import torch\n\ndef train(loader, model, optimizer):\n" + "".join(
        "    " + line + "\n"
        for line in [
            "for x, y in loader:",
            "    loss = model(x, y)",
            "    loss.backward()",
            "    optimizer.step()",
            "    print(loss.item())",
        ]
    )
    assert "XLA401" in codes(library)
