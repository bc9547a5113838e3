"""gpipe's benchmark models in PyTorch, layer for layer (docs/WORKLOADS.md)."""
import contextlib
import math


def transformer(torch, vocab=256, dim=512, heads=8, d_ff=2048, layers=8, seq_len=128,
                sdpa=False):
    """T1 (and T2 with dim 256, heads 4, d_ff 1024, layers 32; T3 with dim 2048, heads 16,
    d_ff 8192, layers 24, seq_len 1024): GPT-style decoder, pre-LayerNorm, causal multi-head
    self-attention with biases, tanh GELU MLP, learned positions, final LayerNorm, untied head
    without bias, no dropout. sdpa: attention through F.scaled_dot_product_attention (fused
    kernels on a GPU) instead of the explicit masked score matrix; the same function."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim)
            self.fc1 = nn.Linear(dim, d_ff)
            self.fc2 = nn.Linear(d_ff, dim)
            if not sdpa:
                self.register_buffer("mask", torch.triu(torch.ones(seq_len, seq_len,
                                                                   dtype=torch.bool), 1))

        def forward(self, x):
            B, T, C = x.shape
            hd = C // heads
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q = q.view(B, T, heads, hd).transpose(1, 2)
            k = k.view(B, T, heads, hd).transpose(1, 2)
            v = v.view(B, T, heads, hd).transpose(1, 2)
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
                att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(dim=-1)
                y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, dim)
            self.pos = nn.Parameter(torch.zeros(seq_len, dim))
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)

        def forward(self, idx):
            x = self.emb(idx) + self.pos[:idx.shape[1]]
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln_f(x))

    return LM()


def convnet(torch, ch1=32, ch2=64, hidden=256, classes=10):
    """C1: conv3x3(1->32, pad 1, no bias)+BN+ReLU, conv3x3(32->32)+BN+ReLU, maxpool2,
    conv3x3(32->64)+BN+ReLU, conv3x3(64->64)+BN+ReLU, maxpool2, flatten,
    linear(3136->256)+ReLU, linear(256->10)."""
    nn = torch.nn

    def cbr(i, o):
        return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]

    return nn.Sequential(*cbr(1, ch1), *cbr(ch1, ch1), nn.MaxPool2d(2),
                         *cbr(ch1, ch2), *cbr(ch2, ch2), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(ch2 * 7 * 7, hidden), nn.ReLU(),
                         nn.Linear(hidden, classes))


def lm_step(torch, model, batch, seq_len, vocab, lr=3e-4, weight_decay=0.01, device=None,
            autocast_dtype=None, fused=False):
    """One AdamW step on random bytes (labels: the next byte). device: where the data lives (the
    model's device; default the CPU); autocast_dtype: the forward under torch.autocast in that
    type (mixed precision, the parameters and the update stay float32); fused: the fused AdamW."""
    F = torch.nn.functional
    # Only named when wanted: fused=False spelt out would also turn off the default foreach.
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay,
                            **({"fused": True} if fused else {}))
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, vocab, (batch, seq_len + 1), generator=g)
    if device is not None:
        data = data.to(device)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def forward_context():
        if autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=x.device.type, dtype=autocast_dtype)

    def step():
        opt.zero_grad(set_to_none=True)
        with forward_context():
            loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
        loss.backward()
        opt.step()
    return step


def classifier_step(torch, model, batch, lr=0.05, momentum=0.9):
    """One SGD (momentum) step on standard normal images and uniform labels."""
    F = torch.nn.functional
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    model.train()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return step
