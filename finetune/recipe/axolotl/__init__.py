"""What finetune knows of axolotl's recipes: its keys, values and dataset types, each with its finetune equivalent
or why there is none. Pure data and small functions, below the recipe's loading so both can read it:

    keys.py        every recipe's keys and values (and GRPO's top-level ones), with what each becomes
    unhonoured.py  the keys that change what is trained and that finetune cannot honour
    preference.py  `rl:` preference recipes: their keys' hints, axolotl's preference dataset types
    vision.py      the multimodal (vision-language) keys' hints (their conversion: port/axolotl_vision.py)
    chat_templates.py  axolotl's chat template names and the families whose tokenizers ship them
    hints.py       what `finetune validate` says of an axolotl key or value (recipe/load.py)

`finetune port` (finetune/port/, above the recipe: it builds a Recipe) converts whole recipes with these tables.
"""
