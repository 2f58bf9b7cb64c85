"""What the tests share: tiny models of real architectures, data rows, a served process; imported as tests.helpers.*."""
