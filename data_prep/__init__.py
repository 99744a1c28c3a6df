"""``diva-prep``: build DIVA parquet files (see :mod:`verl_ext.data.schema`) offline.

Subcommands (``diva-prep --help``, also ``python -m data_prep``):

* ``convert``  local geometry3k / MMK12 parquet or JSONL files -> DIVA parquet, bad rows quarantined
* ``variants`` paraphrases and reasoning hints from any OpenAI-compatible endpoint, cached and resumable
* ``validate`` schema and content checks with a readable report
* ``synth``    a small synthetic multimodal math set drawn with PIL (no download needed)
"""
