"""One DistributedDataParallel step on CPU (gloo): every worker must end with the same averaged gradient."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1, bias=False))
# worker r sees the input (r+1)*ones, so the averaged gradient of sum(w.x) is mean(r+1) in every entry
inputs = torch.full((1, 4), float(rank + 1))
model(inputs).sum().backward()
grad = model.module.weight.grad[0, 0].item()
expected = (world + 1) / 2
check = torch.tensor([grad])
dist.all_reduce(check)
print(f"worker {rank}/{world} (node {os.environ.get('GROUP_RANK', '?')}): grad={grad:.3f} expected={expected:.3f}",
      flush=True)
if rank == 0:
    ok = abs(grad - expected) < 1e-6 and abs(check.item() - world * expected) < 1e-4
    print(f"ddp allreduce result: {check.item():.3f} {'OK' if ok else 'WRONG'}", flush=True)
# every rank past its last collective before any closes its connections: gloo aborts a rank whose peer
# disconnects first ("terminate called without an active exception"), failing a job that succeeded
dist.barrier()
dist.destroy_process_group()
