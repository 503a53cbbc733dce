"""Facts about one module that several rules need, computed once per lint pass and shared by its rules.

- `module`: the module's nodes by kind, its scopes and whole-module facts (`ModuleAnalysis`);
- `steps`: the one definition of a training step and of the loop that runs it;
- `context`: `StepContextRule`, the rule base class that reads these facts (tensors, scopes, loaders).
"""
