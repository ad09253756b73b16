"""Class prototypes (fedcache/federate/prototypes.py): per-client class means and their aggregation."""
import torch

from fedcache.federate.prototypes import aggregate, class_means


def test_class_means_and_counts():
    z = torch.tensor([[[1.0, 0], [3, 0], [0, 2], [9, 9]]])
    y = torch.tensor([[0, 0, 2, 1]])
    mask = torch.tensor([[True, True, True, False]])  # the last row is padding
    protos, counts = class_means(z, y, mask, 3)
    assert counts.tolist() == [[2.0, 0.0, 1.0]]
    assert protos[0].tolist() == [[2.0, 0.0], [0.0, 0.0], [0.0, 2.0]]


def test_aggregation_weighted_by_class_counts_and_plain_mean():
    protos = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[3.0, 0.0], [0.0, 4.0]]])  # 2 clients, 2 classes
    counts = torch.tensor([[1.0, 0.0], [3.0, 2.0]])
    glob, present = aggregate(protos, counts, weighted=True)
    assert glob.tolist() == [[(1 * 1 + 3 * 3) / 4, 0.0], [0.0, 4.0]] and present.tolist() == [True, True]
    glob, _ = aggregate(protos, counts, weighted=False)
    assert glob.tolist() == [[2.0, 0.0], [0.0, 4.0]]  # class 1: only client 1 holds it
