"""tunesmith's tests, laid out as the package is (docs/tests.md): core/<layer>/, features/<feature>/, cli/, system/,
benchmarks/, and helpers/ (tiny models, data rows, a served process) that the tests import as `tests.helpers...`."""
