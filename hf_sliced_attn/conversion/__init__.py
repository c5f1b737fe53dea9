"""From a softmax checkpoint to a converted one: everything attention transfer needs.

The modules, in the order a conversion uses them:

* :mod:`.model_sources`: where a model comes from (a folder or a Hub id), and the names to record;
* :mod:`.training_text`: passages, the held-out split, the deterministic stream of batches;
* :mod:`.attention_taps`: recording (or replacing) each attention layer's output, masked losses;
* :mod:`.transfer`: the training loop (stage 1 attention matching, stage 2 distillation), resumable;
* :mod:`.fidelity`: how close the converted model is to the softmax one on held-out text;
* :mod:`.hybrid`: which layers keep softmax attention;
* :mod:`.converted_folder`: saving, loading and checking a converted folder;
* :mod:`.cards`: the model cards;
* :mod:`.sentence_transformers_files`: the sentence-transformers files a converted copy keeps.
"""
