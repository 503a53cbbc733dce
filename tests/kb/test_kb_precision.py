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


# --- dataset-size / framework-managed: XLA414 needs a training loader that can end in a partial batch ----
def loader_codes(source: str) -> set[str]:
    return {f.code for f in lint_source("import torch\nimport torchvision\n" + source) if f.code == "XLA414"}


def test_a_batch_size_that_divides_the_standard_split_leaves_no_partial_batch():
    mnist = "train_set = torchvision.datasets.MNIST(root='data', train=True, download=True)\nbatch = {}\n"
    loader = "loader = torch.utils.data.DataLoader(dataset=train_set, batch_size=batch, shuffle=True)\n"
    assert not loader_codes(mnist.format(100) + loader)  # 60000 = 600 * 100
    assert loader_codes(mnist.format(128) + loader)  # 60000 = 468 * 128 + 96


def test_evaluation_loaders_keep_their_last_batch():
    assert not loader_codes("test_loader = torch.utils.data.DataLoader(test_set, batch_size=32, shuffle=True)\n")


def test_a_loader_handed_to_accelerate_prepare_is_evened_out_there():
    source = (
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "dl = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True)\n"
        "model, dl = accelerator.prepare(model, dl)\n"
    )
    assert not loader_codes(source)
    assert loader_codes(source.replace("model, dl = accelerator.prepare(model, dl)\n", ""))


# --- process-group / message-wrong: distributed code that XLA already runs as written -----------------
def test_rpc_roles_started_with_mp_spawn_are_no_gpu_launch():
    source = (
        "import torch.multiprocessing as mp\n"
        "import torch.distributed.rpc as rpc\n"
        "def run(rank, world):\n"
        "    rpc.init_rpc(f'worker{rank}', rank=rank, world_size=world)\n"
        "mp.spawn(run, args=(3,), nprocs=3, join=True)\n"
    )
    assert "XLA225" not in codes(source)
    assert "XLA225" in codes(
        source.replace("    rpc.init_rpc(f'worker{rank}', rank=rank, world_size=world)", "    pass")
    )


def test_a_module_that_creates_the_process_group_may_ask_it_for_ranks():
    body = (
        "from torch.utils.data import DistributedSampler\n"
        "import torch.distributed as dist\n"
        "def main(ds):\n"
        "{init}"
        "    sampler = DistributedSampler(ds)\n"
        "    if dist.get_rank() == 0:\n"
        "        print('ready')\n"
    )
    assert not codes(body.format(init="    dist.init_process_group('nccl')\n")) & {"XLA706", "XLA707"}
    assert {"XLA706", "XLA707"} <= codes(body.format(init=""))


# --- float32-program: BCE after a sigmoid somewhere only saturates in low precision --------------------
BCE_MODULE = (
    "import torch\nimport torch.nn as nn\n"
    "head = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\n"
    "criterion = nn.BCELoss()\n"
    "loss = criterion(head(x), y)\n"
)


def test_bce_in_a_float32_program_behaves_as_on_a_gpu():
    assert "XLA505" not in codes(BCE_MODULE)
    assert "XLA505" in codes(BCE_MODULE + "head = head.to(torch.bfloat16)\n")
    assert "XLA505" in codes(
        "import torch\nimport torch.nn.functional as F\nF.binary_cross_entropy(torch.sigmoid(z), y)\n"
    )
