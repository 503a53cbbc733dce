"""Facts about one module that several rules need, computed once per lint pass and shared by its rules.

- `module`: `ModuleAnalysis`, the record the engine builds once per pass and hands to every rule;
- `steps`: the one definition of a training step, of the loop that runs it, and of the training loop;
- `scopes`: `ScopedRule`, rules that read the module's nodes by kind, scopes and module-wide facts;
- `context`: `StepContextRule`, adding tensors vs host values, device context and data loaders;
- `env`: environment variables set in code; `optimizers`: optimizers and the modules moved to a device;
- `devices`: where device values come from and flow to, and which code only runs with CUDA (guards);
  `device_facts` what it records (guards, facts), its one walk of the module and the device-expression helpers;
- `leftovers`: CUDA references that a migration left neither rewritten nor reported.
"""
