"""safetensors.numpy reads BF16 as numpy's "bfloat16", which exists once ml_dtypes is imported
(the test extra installs it); import it here so test order cannot matter."""
import ml_dtypes  # noqa: F401
