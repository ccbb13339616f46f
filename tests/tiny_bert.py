"""The tiny random BERT of the fast test tier (HF BertModelTester-style sizes), shared by tests."""

#: keyword arguments for ``transformers.BertConfig`` / ``bertattn.BertConfig``
TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=128,
    type_vocab_size=2,
)
