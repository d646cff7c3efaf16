"""Small models that are in no zoo, for pswitch's export, parity and end-to-end tests."""
import torch
from torch import nn


class ResidualCNN(nn.Module):
    """conv-bn-relu stem, one residual block with a 1x1 projection branch, pool, linear head."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU())
        self.conv1 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()  # used twice: two layers, one module
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.project = nn.Sequential(nn.Conv2d(8, 16, 1, stride=2, bias=False), nn.BatchNorm2d(16))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        x = self.stem(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        y = self.relu(y + self.project(x))
        return self.head(torch.flatten(self.pool(y), 1))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        h = self.heads
        q = q.reshape(b, s, h, d // h).transpose(1, 2)
        k = k.reshape(b, s, h, d // h).transpose(1, 2)
        v = v.reshape(b, s, h, d // h).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // h) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class TinyTransformer(nn.Module):
    """Token embedding tied to the output projection; the positional embedding is a parameter of
    the model itself (no leaf module owns it)."""

    def __init__(self, vocab=100, dim=32, seq=16, layers=2, heads=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class MaskedBlock(Block):
    """Block whose attention skips padded positions (mask 0)."""

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        h = self.heads
        q = q.reshape(b, s, h, d // h).transpose(1, 2)
        k = k.reshape(b, s, h, d // h).transpose(1, 2)
        v = v.reshape(b, s, h, d // h).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / (d // h) ** 0.5
        scores = scores.masked_fill(mask[:, None, None, :] == 0, -1e4)
        x = x + self.proj((torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class MaskedClassifier(nn.Module):
    """A fine-tuned-BERT shape: token and segment embeddings, encoder blocks that honour the
    attention mask, a classification head on the first token. Takes (input, attention_mask,
    token_type_ids)."""

    def __init__(self, vocab=100, dim=32, seq=16, layers=2, heads=4, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.segment = nn.Embedding(2, dim)
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.blocks = nn.ModuleList([MaskedBlock(dim, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens, attention_mask, token_type_ids):
        x = self.embed(tokens) + self.segment(token_type_ids) + self.pos[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x, attention_mask)
        return self.head(self.norm(x)[:, 0])


SHAPES = {"residual_cnn": (3, 32, 32), "tiny_transformer": (16,), "masked_classifier": (16,)}


def make(name, seed=0):
    torch.manual_seed(seed)
    if name == "residual_cnn":
        model = ResidualCNN()
        for m in model.modules():  # statistics that are not the identity, so they matter
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.uniform_(m.bias, -0.5, 0.5)
    elif name == "tiny_transformer":
        model = TinyTransformer()
    elif name == "masked_classifier":
        model = MaskedClassifier()
    else:
        raise KeyError(name)
    return model.eval()


def example_inputs(name, batch, seed=0):
    """The model's example inputs as a tuple: for masked_classifier, tokens, a padding mask
    (each row's tail masked out) and segment ids."""
    if name != "masked_classifier":
        return (example_input(name, batch, seed),)
    gen = torch.Generator().manual_seed(seed)
    seq = SHAPES[name][0]
    tokens = torch.randint(0, 100, (batch, seq), generator=gen)
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=gen)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    types = (torch.arange(seq)[None, :] >= seq // 2).long().expand(batch, seq).contiguous()
    return tokens, mask, types


def example_input(name, batch, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if name in ("tiny_transformer", "masked_classifier"):
        return torch.randint(0, 100, (batch,) + SHAPES[name], generator=gen)
    return torch.randn((batch,) + SHAPES[name], generator=gen)
