"""What the draft-LM family of draft kinds shares, in no kind's folder (no kind.py: not a kind).

The draft-lm kind (drafts/draft_lm) and PARD (drafts/pard) both train a small HF causal LM with
the target's tokenizer: where it starts and the tokenizer check (build.py), the `DraftLM`
wrapper with the target's frozen norm and lm_head (model.py), the full-vocab distillation loss
(losses.py), the export dir's files (export.py) and the kind behaviour both inherit
(kind_base.py).
"""
