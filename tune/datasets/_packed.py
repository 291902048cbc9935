from torch.utils.data import Dataset

from tune.data import ModelTokenizer, PackedDataset


def maybe_pack(ds: Dataset, tokenizer: ModelTokenizer, packed: bool, *, split_across_pack: bool = False) -> Dataset:
    """Wraps ``ds`` in a :class:`~tune.data.PackedDataset` of ``tokenizer.max_seq_len`` when ``packed``."""
    if not packed:
        return ds
    max_seq_len = getattr(tokenizer, "max_seq_len", None)
    if max_seq_len is None:
        raise ValueError(
            "packed=True needs the tokenizer's max_seq_len (the length of each pack); set tokenizer.max_seq_len "
            "in the config, e.g. `tokenizer.max_seq_len=2048`."
        )
    return PackedDataset(ds, max_seq_len=max_seq_len, padding_idx=tokenizer.pad_id, split_across_pack=split_across_pack)
