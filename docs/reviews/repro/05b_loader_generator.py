"""05b review: midepoch.train_epochs gives its DataLoader generator=torch.Generator().manual_seed(config.seed),
the same on every rank and every epoch. With num_workers=0 (as there) it only feeds the workers' base seed,
which nobody uses; a learner who copies it and adds workers gets the same worker seeds, hence the same
random augmentation, on every rank and in every epoch (T/utils/data/dataloader.py:690-694, worker.py:274-281).
Two "ranks" are two loaders in one process here: only the generator decides the base seed."""
import torch
from torch.utils.data import DataLoader, Dataset


class Augment(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.rand(()).item()  # a random augmentation drawn in the worker


def draws(seed_for_generator):
    loader = DataLoader(Augment(), batch_size=1, num_workers=2,
                        generator=torch.Generator().manual_seed(seed_for_generator))
    return [round(float(b), 4) for b in loader]


if __name__ == "__main__":
    seed = 0
    for epoch in range(2):
        print(f"epoch {epoch}: rank 0 {draws(seed)}  rank 1 {draws(seed)}   (as in midepoch.py)")
    print("seeded from (seed, epoch, rank):",
          [draws(seed * 1000 + 100 * epoch + rank) for epoch in range(2) for rank in range(2)])
