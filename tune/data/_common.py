# Label value ignored by the loss (torch.nn.functional.cross_entropy's default ignore_index).
CROSS_ENTROPY_IGNORE_IDX = -100
