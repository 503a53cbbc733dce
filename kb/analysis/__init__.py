"""Facts about one module that several rules need, computed once per lint pass and shared by its rules.

Above kb's helpers (`cst_walk`, `cst_helpers`, `finding`, `parsing`), below the rule bases (kb/rule.py,
kb/scoped_rule.py, kb/step_rule.py, kb/env_rule.py) and the rules: what reads a module through the rule that asks
takes a `view` protocol, never a rule class (tests/layers.py `KB_LEVELS`).

- `module`: `ModuleAnalysis`, the record the engine builds once per pass and hands to every rule;
- `view`: what the analysis reads through a rule (`RuleView`, `ScopedView`, `StepView`);
- `steps`: the one definition of a training step, of the loop that runs it, and of the training loop;
- `project`: steps across a tree's modules (`project_steps` the data each module tells the tree);
- `env`: environment variables set in code; `optimizers`: optimizers and the modules moved to a device;
- `devices`: where device values come from and flow to, and which code only runs with CUDA (guards);
  `device_facts` what it records (guards, facts), its one walk of the module and the device-expression helpers;
- `leftovers`: CUDA references that a migration left neither rewritten nor reported.
"""
