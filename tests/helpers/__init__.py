"""What the tests share, one idea per module.

- :mod:`.models`: the tiny configuration of each architecture family, tiny converted encoders, a
  tokenizer and saved checkpoints (with the shipped text files' paths).
- :mod:`.comparisons`: the error measures (``relative_error``, ``scaled_error``) and the comparison of
  an op with its float64 reference, values and gradients (``assert_matches_reference``).
- :mod:`.op_inputs`: random inputs of the attention ops (``attention_inputs``, ``key_padding``).
- :mod:`.native`: ``requires_compiler``, the mark of the tests that need the C++ CPU kernel.
- :mod:`.fixtures`: fixtures every folder gets (``softmax_checkpoint``), through the root conftest.
- :mod:`.threads`: ``one_thread``, autouse where it is imported.
"""
