"""kb/codegen.py: a fix's modules generated a top-level statement at a time give libcst's text exactly."""

import libcst as cst
import pytest
from xlaport.kb.codegen import ModuleTexts

TEXTS = [
    "#!/usr/bin/env python\n# header comment\n\nimport torch\n\n\ndef f(x):\n    return x.cuda()  # move\n\n# footer\n",
    "import os\r\nx = 1; y = 2\r\nif x:\r\n\tprint(y)\r\n",
    "@decorator(\n    1,\n)\nclass A:\n    '''doc'''\n\n    def m(self):\n        pass\n",
    "x = 1\n\n\n# only a comment after\n\n",
    "x = 1  # no newline at the end",
    "",
    "# a comment alone\n",
]


@pytest.mark.parametrize("text", TEXTS)
def test_the_text_of_a_module_is_libcsts(text):
    module = cst.parse_module(text)
    assert ModuleTexts().code(module) == module.code == text


def test_modules_that_share_statements_each_get_their_own_text():
    module = cst.parse_module(TEXTS[0])
    texts = ModuleTexts()
    assert texts.code(module) == TEXTS[0]
    function = module.body[1]
    renamed = module.with_changes(body=[module.body[0], function.with_changes(name=cst.Name("g"))])
    without_import = module.with_changes(body=[function])
    crlf = module.with_changes(default_newline="\r\n")
    for changed in (renamed, without_import, crlf, module):
        assert texts.code(changed) == changed.code


def test_a_statement_seen_before_is_not_generated_again(monkeypatch):
    module = cst.parse_module(TEXTS[0])
    texts = ModuleTexts()
    texts.code(module)
    new_import = cst.parse_statement("import torch_xla\n")
    with_import = module.with_changes(body=[new_import, *module.body])
    expected = with_import.code
    generated = []
    code_for_node = cst.Module.code_for_node
    monkeypatch.setattr(
        cst.Module, "code_for_node", lambda self, node: generated.append(node) or code_for_node(self, node)
    )
    assert texts.code(with_import) == expected
    assert new_import in generated and not {id(s) for s in module.body} & {id(n) for n in generated}
