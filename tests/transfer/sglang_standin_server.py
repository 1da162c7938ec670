"""Stand-in for an SGLang server's distributed weight-update endpoints, run as a script.

SGLang cannot run on this CPU machine (REFERENCE §6.5), so this FastAPI app follows its
request shapes and receive order (one broadcast per listed tensor, in order, from rank 0) on
gloo, to test `SGLangDistributedSender` against a real HTTP server in another process.
Usage: python sglang_standin_server.py PORT
"""

import base64
import sys

import torch
import torch.distributed as dist
import uvicorn
from fastapi import FastAPI

from loongsage.transfer.sglang import join_group

app = FastAPI()
state: dict = {"group": None, "weights": {}, "version": None, "calls": 0}


@app.post("/init_weights_update_group")
def init_weights_update_group(body: dict) -> dict:
    state["group"] = join_group(master_address=body["master_address"],
                                master_port=body["master_port"], rank=body["rank_offset"],
                                world_size=body["world_size"], group_name=body["group_name"],
                                backend=body["backend"], timeout_s=60)
    return {"success": True, "message": "ok"}


@app.post("/update_weights_from_distributed")
def update_weights_from_distributed(body: dict) -> dict:
    for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
        tensor = torch.empty(shape, dtype=getattr(torch, dtype))
        dist.broadcast(tensor, src=0, group=state["group"])
        state["weights"][name] = tensor
    state["version"] = body["weight_version"]
    state["calls"] += 1
    return {"success": True, "message": "ok"}


@app.post("/destroy_weights_update_group")
def destroy_weights_update_group(body: dict) -> dict:
    return {"success": True, "message": "ok"}


@app.get("/dump")
def dump() -> dict:
    return {"version": state["version"], "calls": state["calls"],
            "weights": {n: base64.b64encode(t.view(-1).view(torch.uint8).numpy().tobytes())
                        .decode() for n, t in state["weights"].items()}}


@app.get("/health")
def health() -> dict:
    return {"ok": True}


if __name__ == "__main__":
    torch.set_num_threads(1)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
