"""A plain torch script (no trainbox import): env:// init, one all-reduce, OUT/<rank>.json.

It reads LOCAL_RANK with a default, as a script meant to run alone too must: behind `trainbox
exec` with no launcher there is none (Lightning would take one for a launcher's).
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
Path(sys.argv[1], f"{rank}.json").write_text(
    json.dumps(
        {
            "rank": rank,
            "world_size": dist.get_world_size(),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "sum": total.item(),
        }
    )
)
dist.destroy_process_group()
