"""False-positive classes found on real repositories (bench/precision.py), each as a small fixture in our
own words: the finding must go away where the code gives no reason for it, and stay where it does."""

from xlaport.kb import lint_source


def codes(source: str) -> set[str]:
    return {f.code for f in lint_source(source)}


# --- not-on-device: a script that names no device trains on the CPU ------------------------------
CPU_SCRIPT = """
import matplotlib.pyplot as plt
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
for epoch in range(3):
    for x, y in loader:
        output = model(x)
        loss = ((output - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(loss.item())
        preds = model(x).detach().numpy()
torch.save(model.state_dict(), "model.ckpt")
model.load_state_dict(torch.load("model.ckpt"))
plt.xlabel("epoch")
"""
DEVICE_CODES = {"XLA206", "XLA221", "XLA307", "XLA401", "XLA404", "XLA406", "XLA408", "XLA414", "XLA701"}


def test_a_script_that_names_no_device_gets_no_device_findings():
    assert not codes(CPU_SCRIPT) & DEVICE_CODES


def test_the_same_script_moved_to_cuda_gets_them():
    on_gpu = CPU_SCRIPT.replace("model = nn.Linear(3, 1)", "model = nn.Linear(3, 1).to('cuda')")
    assert {"XLA206", "XLA307", "XLA401", "XLA406", "XLA408", "XLA414", "XLA701"} <= codes(on_gpu)


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
    # a CUDA module that asks torch.distributed: its program created the group elsewhere (else the GPU run fails)
    assert not codes(body.format(init="")) & {"XLA706", "XLA707"}
    # torch_xla code without a group of its own: launched by torch_xla.launch, there may be none
    assert {"XLA706", "XLA707"} <= codes("import torch_xla\n" + body.format(init=""))


# --- float32-program: BCE after a sigmoid somewhere only saturates in low precision --------------------
BCE_MODULE = (
    "import torch\nimport torch.nn as nn\n"
    "head = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\n"
    "criterion = nn.BCELoss()\n"
    "loss = criterion(head(x), y)\n"
)


def test_bce_in_a_float32_program_behaves_as_on_a_gpu():
    assert "XLA505" not in codes(BCE_MODULE)
    assert "XLA505" not in codes(BCE_MODULE.replace("nn.Sigmoid()", "nn.Identity()") + "p = z.sigmoid()\n")
    assert "XLA505" in codes(BCE_MODULE + "head = head.to(torch.bfloat16)\n")
    assert "XLA505" in codes(
        "import torch\nimport torch.nn.functional as F\nF.binary_cross_entropy(torch.sigmoid(z), y)\n"
    )


# --- cuda-guard: code that only runs with CUDA ------------------------------------------------------
def test_code_after_an_early_return_without_cuda_is_never_reached_on_a_tpu_host():
    source = (
        "import torch\n"
        "class Attend:\n"
        "    def __init__(self, flash):\n"
        "        self.config = None\n"
        "        if not torch.cuda.is_available() or not flash:\n"
        "            return\n"
        "        props = torch.cuda.get_device_properties(torch.device('cuda'))\n"
        "        self.config = props.major\n"
    )
    assert not codes(source) & {"XLA202", "XLA203", "XLA605"}
    unguarded = source.replace("        if not torch.cuda.is_available() or not flash:\n            return\n", "")
    assert {"XLA202", "XLA605"} <= codes(unguarded)


def test_cuda_housekeeping_behind_a_guard_is_left_alone():
    source = (
        "import torch\nimport torch.backends.cudnn as cudnn\n"
        "def log(msg):\n"
        "    if torch.cuda.is_available():\n"
        "        print(msg, torch.cuda.max_memory_allocated())\n"
        "    else:\n"
        "        print(msg)\n"
        "def setup(model):\n"
        "    if torch.cuda.is_available():\n"
        "        model = model.cuda()\n"
        "        cudnn.benchmark = True\n"
        "    return model\n"
    )
    found = {(f.code, f.line) for f in lint_source(source)}
    assert not {code for code, _ in found} & {"XLA203", "XLA601", "XLA205"}
    assert "XLA205" in codes("import torch.backends.cudnn as cudnn\ncudnn.benchmark = True\n")


def test_a_guard_that_only_adds_a_memory_column_to_a_log_line_is_left_alone():
    source = (
        "import torch\n"
        "def log_every(items):\n"
        "    fields = ['step {step}', 'loss {loss}']\n"
        "    if torch.cuda.is_available():\n"
        "        fields.append('max mem: {memory:.0f}')\n"
        "    for step, loss in items:\n"
        "        print(' '.join(fields).format(step=step, loss=loss, memory=0))\n"
    )
    assert "XLA203" not in codes(source)
    # a guard around a setting that changes the run is not text: reported
    assert "XLA203" in codes(source.replace("fields.append('max mem: {memory:.0f}')", "batch_size = 64"))


def test_a_cuda_flag_nobody_reads_picks_nothing():
    source = "import torch\nclass Loop:\n    def __init__(self):\n        self.sync_cuda = torch.cuda.is_available()\n"
    assert "XLA203" not in codes(source)
    assert "XLA203" in codes(source + "    def run(self):\n        if self.sync_cuda:\n            pass\n")


# --- not-a-tensor / not-on-device: a fallback op needs a device tensor ----------------------------
def test_median_of_python_numbers_or_a_cpu_tensor_is_no_xla_fallback():
    source = (
        "import statistics\nimport torch\n"
        "class Meter(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        a = statistics.median([1.0, 2.0])\n"
        "        d = torch.tensor(list(self.values))\n"
        "        b = d.median().item()\n"
        "        return x.median()\n"
    )
    assert [f.line for f in lint_source(source) if f.code == "XLA514"] == [8]


# --- gpu-only-branch / message-wrong: what the code does on a TPU host --------------------------------
def test_a_multi_gpu_test_on_the_device_count_takes_the_single_device_path_on_tpu():
    source = "import torch\nif torch.cuda.device_count() > 1:\n    model = torch.nn.DataParallel(model)\n"
    assert "XLA211" not in codes(source)
    assert "XLA211" in codes("import torch\nworld_size = torch.cuda.device_count()\n")


def test_a_tensor_built_once_per_epoch_is_not_copied_every_step():
    source = (
        "import torch\n"
        "for epoch in range(3):\n"
        "    state = torch.zeros(2, 8).to(device)\n"
        "    for x in loader:\n"
        "        noise = torch.randn(8).to(device)\n"
        "        loss = model(x, state, noise)\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
    )
    assert [f.line for f in lint_source(source) if f.code == "XLA222"] == [5]


def test_is_cuda_and_a_multi_gpu_count_only_pick_data_parallel():
    source = (
        "import torch.nn as nn\n"
        "class G(nn.Module):\n"
        "    def forward(self, x):\n"
        "        if (x.is_cuda or x.is_xpu) and self.ngpu > 1:\n"
        "            return nn.parallel.data_parallel(self.main, x, range(self.ngpu))\n"
        "        return self.main(x)\n"
    )
    assert "XLA220" not in codes(source)
    assert "XLA220" in codes(source.replace(" and self.ngpu > 1", ""))


def test_a_device_type_test_around_the_device_choice_is_one_finding_the_guard_flip():
    # the guard picks the placement (`.cuda()`), so XLA230 rewrites the test; XLA220 would report it twice
    source = (
        "import torch\n"
        "def place(model, device):\n"
        "    if device.type == 'cuda':\n"
        "        model = torch.nn.DataParallel(model).cuda()\n"
        "    else:\n"
        "        model.to(device)\n"
        "    return model\n"
    )
    found = [(f.line, f.code) for f in lint_source(source) if f.code in ("XLA220", "XLA230")]
    assert found == [(3, "XLA230")]
    batch_size = source.replace("model = torch.nn.DataParallel(model).cuda()", "batch = 64")
    assert [(f.line, f.code) for f in lint_source(batch_size) if f.code in ("XLA220", "XLA230")] == [(3, "XLA220")]


def test_is_cuda_choosing_a_config_that_only_cuda_hosts_set_takes_the_same_value_on_tpu():
    source = (
        "import torch\n"
        "import torch.nn as nn\n"
        "class Attend(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.cpu_config = (True, True)\n"
        "        self.cuda_config = None\n"
        "        if not torch.cuda.is_available():\n"
        "            return\n"
        "        self.cuda_config = (True, False)\n"
        "    def forward(self, q):\n"
        "        n, on_gpu = q.shape[0], q.is_cuda\n"
        "        config = self.cuda_config if on_gpu else self.cpu_config\n"
        "        return run(q, config)\n"
    )
    assert "XLA220" not in codes(source)
    # set on every host: the GPU value is real, and a TPU host would miss it
    everywhere = source.replace("        if not torch.cuda.is_available():\n            return\n", "")
    assert "XLA220" in codes(everywhere)


def test_a_state_dict_saved_after_moving_the_model_to_the_cpu_holds_cpu_tensors():
    source = "import torch\ndef save(model, path):\n    model.eval().cpu()\n    torch.save(model.state_dict(), path)\n"
    assert "XLA701" not in codes(source)
    assert "XLA701" in codes(source.replace("    model.eval().cpu()\n", "    model.eval()\n"))


# --- framework-managed: accelerate's prepared loader marks the step ----------------------------------
def test_a_loop_drawing_batches_from_a_prepared_loader_needs_no_barrier():
    source = (
        "from accelerate import Accelerator\n"
        "from itertools import cycle\n"
        "class Trainer:\n"
        "    def __init__(self, ds):\n"
        "        self.accelerator = Accelerator()\n"
        "        dl = DataLoader(ds, batch_size=16, shuffle=True, drop_last=True)\n"
        "        dl = self.accelerator.prepare(dl)\n"
        "        self.dl = cycle(dl)\n"
        "    def train(self):\n"
        "        while self.step < 100:\n"
        "            data = next(self.dl).to(self.device)\n"
        "            loss = self.model(data)\n"
        "            self.accelerator.backward(loss)\n"
        "            self.opt.step()\n"
    )
    assert "XLA406" not in codes(source)
    assert "XLA406" in codes(source.replace("        dl = self.accelerator.prepare(dl)\n", ""))


# --- not-a-tensor: a forward argument that overrides a number setting --------------------------------
def test_a_forward_argument_that_falls_back_to_a_number_setting_is_no_tensor():
    source = (
        "import torch.nn as nn\n"
        "def default(value, fallback):\n"
        "    return fallback if value is None else value\n"
        "class Guided(nn.Module):\n"
        "    def __init__(self, net, drop_prob=0.5):\n"
        "        super().__init__()\n"
        "        self.net = net\n"
        "        self.drop_prob = drop_prob\n"
        "    def forward(self, x, drop_prob=None):\n"
        "        drop_prob = default(drop_prob, self.drop_prob)\n"
        "        if drop_prob > 0:\n"
        "            x = x * 2\n"
        "        return self.net(x)\n"
    )
    assert "XLA405" not in codes(source)
    # the same argument falling back to a tensor buffer is a tensor: the test reads it on the host
    buffer = source.replace("self.drop_prob = drop_prob", "self.drop_prob = torch.tensor(drop_prob)")
    assert "XLA405" in codes(buffer)


# --- not-on-device: a checkpoint the module itself wrote from CPU values ------------------------------
def test_a_cache_of_plain_data_saved_by_the_module_loads_without_map_location():
    source = (
        "import os\n"
        "import torch\n"
        "model = build().to(device)\n"
        "if os.path.isfile(args.vector_cache):\n"
        "    vocab.vectors = torch.load(args.vector_cache)\n"
        "else:\n"
        "    vocab.vectors = read_vectors()\n"
        "    torch.save(vocab.vectors, args.vector_cache)\n"
    )
    assert "XLA307" not in codes(source)
    # the same path written from the model: device tensors
    assert "XLA307" in codes(source.replace("torch.save(vocab.vectors,", "torch.save(model,"))


def test_a_module_whose_saves_all_write_cpu_tensors_loads_them_without_map_location():
    source = (
        "import torch\n"
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
        "def save(model, optimizer, path):\n"
        "    model.eval().cpu()\n"
        "    torch.save(model.state_dict(), path)\n"
        "    optim_state = FSDP.full_optim_state_dict(model, optimizer)\n"
        "    torch.save(optim_state, path + '.opt')\n"
        "def load(model, path):\n"
        "    model.load_state_dict(torch.load(path))\n"
        "    model.to(device)\n"
    )
    assert "XLA307" not in codes(source)
    assert "XLA307" in codes(source.replace("    model.eval().cpu()\n", ""))


# --- message-wrong: a generate() that is not Hugging Face's ----------------------------------------------
def test_generate_of_a_model_from_another_library_has_no_hf_cache():
    source = (
        "from transformers import GPT2LMHeadModel\n"
        "from mygpt.model import GPT\n"
        "model = GPT.from_pretrained('gpt2')\n"
        "hf = GPT2LMHeadModel.from_pretrained('gpt2')\n"
        "a = model.generate(x, max_new_tokens=20, do_sample=False)\n"
        "b = hf.generate(x, max_new_tokens=20, do_sample=False)\n"
    )
    assert [f.line for f in lint_source(source) if f.code == "XLA415"] == [6]


# --- inference-only: a split tie changes no number when nothing trains ------------------------------------
def test_a_tied_hf_model_moved_for_inference_only_keeps_its_numbers():
    source = (
        "import torch\n"
        "from transformers import GPT2LMHeadModel\n"
        "def compare(device, x):\n"
        "    hf = GPT2LMHeadModel.from_pretrained('gpt2')\n"
        "    hf.to(device)\n"
        "    return hf(x).logits\n"
    )
    assert "XLA314" not in codes(source)
    # trained in the same module, or handed to a caller who may train it: the copies drift apart
    assert "XLA314" in codes(source + "loss = compare(d, x).sum()\nloss.backward()\n")
    assert "XLA314" in codes(source.replace("    return hf(x).logits\n", "    return hf\n"))


# --- framework-managed: CUDA data-parallel code reduces its gradients somewhere -------------------------
def test_a_cuda_train_function_of_a_wrapped_model_needs_no_xla_all_reduce():
    source = (
        "import torch\n"
        "import torch.distributed as dist\n"
        "def setup():\n"
        "    dist.init_process_group('nccl')\n"
        "def train(model, loader, optimizer, rank):\n"
        "    for x, y in loader:\n"
        "        x, y = x.to(rank), y.to(rank)\n"
        "        loss = model(x, y)\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
    )
    assert "XLA407" not in codes(source)  # the model arrives wrapped (FSDP/DDP in the caller's file)
    assert "XLA407" in codes("import torch_xla\n" + source)
