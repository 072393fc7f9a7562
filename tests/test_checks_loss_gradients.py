"""The router losses exist for their gradient (the expert-parallel chapter adds both to the loss it
backpropagates), and the permuted tokens carry one (the layer backpropagates through them to the
tokens): an answer with the right value and no gradient, or the wrong gradient, fails, naming it
(helpers/checks/_core/gradients.py); right answers of other forms pass (tests/check_cases.py)."""
import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut
from torch.nn import functional as F

NO_GRAD = "has no gradient"
WRONG_GRAD = "the wrong gradient"


def _counts(expert, n_experts):
    return torch.bincount(expert.reshape(-1), minlength=n_experts).float() / expert.numel()


# ---- balancing_loss ------------------------------------------------------------------------------
@shortcut("check_balancing_loss", "P and f rebuilt with torch.tensor of per-expert values",
          [NO_GRAD, "torch.tensor"])
def balancing_rebuilt(probs, expert, n_experts):
    P = torch.tensor([probs[:, i].mean() for i in range(n_experts)])
    f = torch.tensor([(expert == i).sum().item() / expert.numel() for i in range(n_experts)])
    return n_experts * (f * P).sum()


@shortcut("check_balancing_loss", "summed as Python numbers (.tolist())", NO_GRAD)
def balancing_python(probs, expert, n_experts):
    P = probs.mean(0).tolist()
    f = _counts(expert, n_experts).tolist()
    return n_experts * sum(fi * pi for fi, pi in zip(f, P, strict=True))


@shortcut("check_balancing_loss", "one-hot mean, returned as a float", NO_GRAD)
def balancing_one_hot_float(probs, expert, n_experts):
    f = F.one_hot(expert, n_experts).float().mean((0, 1))
    return float(n_experts * (f * probs.mean(0)).sum())


@shortcut("check_balancing_loss", "the value put in a new leaf that requires grad", NO_GRAD)
def balancing_new_leaf(probs, expert, n_experts):
    value = n_experts * (_counts(expert, n_experts) * probs.mean(0)).sum()
    return torch.tensor(value.item(), requires_grad=True)


@shortcut("check_balancing_loss", "P detached, a zero-weight term keeping a graph",
          [WRONG_GRAD, "probs"])
def balancing_detached_P(probs, expert, n_experts):
    P = probs.detach().mean(0)
    return n_experts * (_counts(expert, n_experts) * P).sum() + 0 * probs.sum()


@other("check_balancing_loss", "counts from one_hot, in float64")
def balancing_float64(probs, expert, n_experts):
    f = F.one_hot(expert, n_experts).double().sum((0, 1)) / expert.numel()
    return n_experts * torch.dot(f, probs.double().mean(0))


@other("check_balancing_loss", "P rebuilt per expert with torch.stack (kept on the graph)")
def balancing_stacked(probs, expert, n_experts):
    P = torch.stack([probs[:, i].mean() for i in range(n_experts)])
    f = torch.tensor([(expert == i).sum().item() / expert.numel() for i in range(n_experts)])
    return n_experts * (f * P).sum()


@other("check_balancing_loss", "each row renormalised first (the same softmax's gradient)")
def balancing_renormalised(probs, expert, n_experts):
    p = probs / probs.sum(-1, keepdim=True)
    return n_experts * (_counts(expert, n_experts) * p.mean(0)).sum()


@other("check_balancing_loss", "P as each expert's share of all the probability mass")
def balancing_mass_share(probs, expert, n_experts):
    return n_experts * (_counts(expert, n_experts) * (probs.sum(0) / probs.sum())).sum()


@shortcut("check_balancing_loss", "f given P's gradient (straight through), value unchanged",
          WRONG_GRAD)
def balancing_straight_through(probs, expert, n_experts):
    P = probs.mean(0)
    f = _counts(expert, n_experts) + P - P.detach()
    return n_experts * (f * P).sum()


@shortcut("check_balancing_loss", "half of P detached", WRONG_GRAD)
def balancing_half_detached(probs, expert, n_experts):
    P = 0.5 * probs.mean(0) + 0.5 * probs.detach().mean(0)
    return n_experts * (_counts(expert, n_experts) * P).sum()


@shortcut("check_balancing_loss", "the first token's row detached", WRONG_GRAD)
def balancing_first_row_detached(probs, expert, n_experts):
    P = torch.cat([probs[:1].detach(), probs[1:]]).mean(0)
    return n_experts * (_counts(expert, n_experts) * P).sum()


def test_wrong_gradient_words_leave_out_reading_values_out():
    """A result on the graph with the wrong gradient is told what changes a gradient, not to
    stop reading values out (.tolist(), .item()), which it did not do."""
    import helpers.checks
    for fn in (balancing_straight_through, balancing_half_detached):
        message = helpers.checks.check_balancing_loss(fn).message
        assert WRONG_GRAD in message and ".detach()" in message, message
        assert ".tolist()" not in message and ".item()" not in message, message


# ---- z_loss --------------------------------------------------------------------------------------
@shortcut("check_z_loss", "log-sum-exp rebuilt per token with torch.tensor", NO_GRAD)
def z_rebuilt(logits):
    lse = torch.tensor([torch.logsumexp(row, 0) for row in logits])
    return (lse ** 2).mean()


@shortcut("check_z_loss", "numpy in float64", NO_GRAD)
def z_numpy(logits):
    a = logits.detach().numpy().astype(np.float64)
    m = a.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(a - m).sum(-1, keepdims=True)))[:, 0]
    return float((lse ** 2).mean())


@shortcut("check_z_loss", "by hand, shifted by the max, returned as a float", NO_GRAD)
def z_by_hand_float(logits):
    m = logits.amax(-1, keepdim=True)
    lse = (m + (logits - m).exp().sum(-1, keepdim=True).log()).squeeze(-1)
    return float((lse * lse).mean())


@shortcut("check_z_loss", "the log term detached (only the max gets a gradient)",
          [WRONG_GRAD, "logits"])
def z_log_detached(logits):
    m = logits.amax(-1)
    rest = torch.log(torch.exp(logits - m[:, None]).sum(-1)).detach()
    return ((m + rest) ** 2).mean()


@shortcut("check_z_loss", "squared in place (pow_ on what logsumexp saved for backward)",
          ["backward through", "in-place"])
def z_squared_in_place(logits):
    return torch.logsumexp(logits, -1).pow_(2).mean()


@other("check_z_loss", "the max taken out by hand, detached")
def z_max_detached(logits):
    m = logits.amax(-1, keepdim=True).detach()
    lse = (m + (logits - m).exp().sum(-1, keepdim=True).log()).squeeze(-1)
    return lse.pow(2).mean()


@other("check_z_loss", "in float64")
def z_float64(logits):
    return (torch.logsumexp(logits.double(), -1) ** 2).mean()


# ---- permute_tokens: the rows go on to the experts, and backward through them to the tokens ----
def _order(expert):
    return torch.argsort(expert.reshape(-1), stable=True) // expert.shape[1]


def _expert_counts(expert, n_experts):
    return torch.bincount(expert.reshape(-1), minlength=n_experts)


@shortcut("check_permute_tokens", "rows collected with .tolist(), rebuilt with torch.tensor",
          [NO_GRAD, "permute_tokens' rows"])
def permute_tolist(x, expert, n_experts):
    rows = [x[t].tolist() for t in _order(expert).tolist()]
    return torch.tensor(rows), _expert_counts(expert, n_experts)


@shortcut("check_permute_tokens", "x.data indexed", NO_GRAD)
def permute_data(x, expert, n_experts):
    return x.data[_order(expert)], _expert_counts(expert, n_experts)


@shortcut("check_permute_tokens", "the rows put in a new leaf that requires grad", NO_GRAD)
def permute_new_leaf(x, expert, n_experts):
    return x.detach()[_order(expert)].requires_grad_(), _expert_counts(expert, n_experts)


@shortcut("check_permute_tokens", "detached rows, a zero-weight term keeping a graph",
          [WRONG_GRAD, "x"])
def permute_detached(x, expert, n_experts):
    return x.detach()[_order(expert)] + 0 * x.sum(), _expert_counts(expert, n_experts)


@other("check_permute_tokens", "numpy for the order, torch indexing for the rows")
def permute_numpy_order(x, expert, n_experts):
    flat = expert.reshape(-1).numpy()
    order = np.argsort(flat, kind="stable") // expert.shape[1]
    return x[torch.from_numpy(order)], torch.from_numpy(np.bincount(flat, minlength=n_experts))


@other("check_permute_tokens", "a one-hot permutation matrix times x")
def permute_matmul(x, expert, n_experts):
    pick = F.one_hot(_order(expert), len(x)).to(x.dtype)
    return pick @ x, _expert_counts(expert, n_experts)


test_case = parametrize_cases(__name__)
