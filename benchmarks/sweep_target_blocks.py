import torch, kvkernels
from kvkernels import launchers
from fuzz.bench_kernels import _time_us
dev="cuda"; max_context=131072; ps=1; max_pages=max_context
r2t = (torch.arange(256*max_context, device=dev, dtype=torch.int64).reshape(256, max_context)) % max_pages
v2p = torch.randperm(max_pages+1, device=dev, dtype=torch.int64)
for tb in (1024, 2048, 4096, 8192):
    launchers.TARGET_BLOCKS = tb
    for bs in (16, 64, 256):
        req = torch.arange(bs, device=dev); seq = torch.full((bs,), max_context, device=dev)
        out = torch.zeros(bs, max_pages, device=dev, dtype=torch.int32)
        f = lambda: kvkernels.build_kv_read_table(req_to_token=r2t, req_pool_indices=req, seq_lens=seq, v2p=v2p, multiplier=1, page_size=ps, max_pages=max_pages, out=out)
        f(); torch.cuda.synchronize(); g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g): f()
        res = []
        for live in (1024, 8192, 131072):
            seq.fill_(live); res.append(round(_time_us(g.replay), 2))
        print(f"TARGET_BLOCKS={tb} bs={bs}: live 1k/8k/128k = {res} us", flush=True)
