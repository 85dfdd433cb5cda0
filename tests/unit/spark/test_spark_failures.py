"""A failed Spark job in one line: the Python worker's own error (issue 20)."""

from __future__ import annotations

from runtime.spark.failures import failure_reason, python_error_line

# What PySpark 4's PythonException says for `rdd.map(f).collect()` where f
# raised ValueError (the paths shortened).
WORKER = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/venv/pyspark.zip/pyspark/worker.py", line 4327, in invoke_udf
    run_process()
  File "/venv/pyspark.zip/pyspark/serializers.py", line 260, in dump_stream
    vs = list(itertools.islice(iterator, batch))
         ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/work/app.py", line 7, in boom
ValueError: bad row 1
"""


class PythonException(Exception):
    """Stands in for pyspark's class of the same name (only its text matters)."""


def test_the_workers_error_is_the_reason() -> None:
    assert python_error_line(WORKER) == "ValueError: bad row 1"
    assert failure_reason(PythonException(WORKER)) == (
        "ValueError: bad row 1 (raised in a Spark Python worker)"
    )


def test_module_paths_chains_and_a_jvm_stack_after_it() -> None:
    chained = (
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "confluent_kafka.KafkaException: KafkaError{code=_TRANSPORT}\n"
        "\n"
        "The above exception was the direct cause of the following exception:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "y.py", line 2, in g\n'
        "runtime.spark.kafka.KafkaSourceError: reading t-0: Broker transport failure\n"
        "\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handle(PythonRunner.scala:600)\n"
        "\tat org.apache.spark.scheduler.Task.run(Task.scala:147)\n"
    )
    assert python_error_line(chained) == "KafkaSourceError: reading t-0: Broker transport failure"
    assert python_error_line("Traceback (most recent call last):\nStopIteration\n") == (
        "StopIteration"
    )


def test_other_failures_keep_their_type_and_first_line() -> None:
    error = RuntimeError("Job aborted due to stage failure\nmore detail")
    assert failure_reason(error) == "RuntimeError: Job aborted due to stage failure"
    assert python_error_line("no traceback here") is None
