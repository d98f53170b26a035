"""The PyTorch integration: custom ops with autograd and fake implementations (torch_ops),
second derivatives and torch.func rules (torch_grad), the torch.nn.LSTM drop-in (nn). Every
module here imports torch."""
