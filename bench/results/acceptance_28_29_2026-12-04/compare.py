import difflib
import json
import sys

a, b = (json.load(open(f"/tmp/audit29/rev-{r}.json")) for r in sys.argv[1:3])


def body(summary):  # the summary without its first line (the temporary output folder)
    return summary.split("\n", 1)[1:]


for kind in ("fix", "migrate"):
    for name in a[kind]:
        x, y = a[kind][name], b[kind][name]
        if kind == "fix":
            diff = sorted(k for k in {*x, *y} if x.get(k) != y.get(k))
            print(f"{kind:7} {name:28} files {len(x):3} differing {len(diff)} {diff[:3]}")
        else:
            fd = sorted(k for k in {*x["files"], *y["files"]} if x["files"].get(k) != y["files"].get(k))
            same = body(x["summary"]) == body(y["summary"])
            print(
                f"{kind:7} {name:28} written {len(x['files']):3} differing {len(fd)} {fd[:3]} summary-equal {same} exit {x['exit']}/{y['exit']}"
            )
            if not same:
                print(
                    "\n".join(
                        difflib.unified_diff(
                            x["summary"].splitlines()[1:], y["summary"].splitlines()[1:], lineterm="", n=0
                        )
                    )
                )
