"""What the EAGLE family of draft kinds shares, in no kind's folder (no kind.py: not a kind).

EAGLE-3 (drafts/eagle3) and P-EAGLE (drafts/peagle) share the head: the speculators format and
`DraftSpec` (format.py), the draft vocabulary (vocab.py), the decoder layer pieces and the TTT
loop (layer.py, model.py), the loss (losses.py), the start from a target layer (init_layer.py),
the vocab and warm-start rules (build.py), the reference drafter (drafter.py), the export
checks (export.py), the kind behaviour both inherit (kind_base.py) and vLLM's draft-vocab argmax
(draft_argmax.py). DFlash (drafts/dflash) takes the layer pieces, loss, vocab, RoPE parameters,
the target's frozen tensors (target_tensors.py) and the vocab rule from here as well, and with
them the draft model's shared half (model.py FamilyDraft: output side, verifier targets, loss),
the decoder fields of config.json and the shape check (format.py), the init_from dir and
lineage check (build.py), the export dir's writing and portable verifier name (export.py), and
the refresh features, vocab ids and vLLM tensor names (kind_base.py).
"""
