"""The per-token rules of decoding, each a small pure piece the engine calls: the acceptance rule
(acceptance), sampling filters (sampling), logit_bias and penalties (adjustments), structured-output grammars
(grammar), logprobs, stop rules (stopping), and a generation's statistics (stats). Nothing here knows a model
or a weight format."""
