"""The ids every sentencepiece model of the toolkit is trained with (prepro.py) and every graph
relies on."""

#: The ids every sentencepiece model of the toolkit is trained with (prepro.py) and every graph
#: relies on.
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
SPECIAL_PIECES = {"<pad>": PAD_ID, "<unk>": UNK_ID, "<s>": BOS_ID, "</s>": EOS_ID}
