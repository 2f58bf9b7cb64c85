"""`tunesmith inspect`: which tokens of each example train, shown as training reads them (SFT's conversations, or a
text corpus's pieces for `tunesmith pt`). Its reading and rendering are the data layer's (data/inspect.py), shared
with both commands; this folder holds its flags, its rows and its command."""
