"""Export a trained run for use elsewhere: merge.py (adapter into its base: a plain HF model), gguf.py (one GGUF
file: gguf_families.py the families llama.cpp runs, gguf_tensors.py the tensors and quantization, gguf_vocab.py the
tokenizer), ollama.py (the Modelfile).

Loading the trained run itself is finetune/model/trained.py (serving and evaluation share it).
"""
