"""Typed configuration: the table of known keys, validation, TOML/env/--set loading.

`StreamsConfig` is built and validated once at start-up (`load_config` or
`StreamsConfig.from_dict`); everything else reads its typed attributes, never a
raw dict. It is immutable, so any thread may read it; building it runs on the
caller's thread (`App(...)`, the CLI).

What is where (import the names from `runtime.config`, as everyone does):

- `keys`: `ConfigKey`, one key's type, default, validation, doc and value
  parsing (with a did-you-mean for enums); `ConfigError`.
- `settings`: `StreamsConfig`, whose fields are the table of known keys, and
  `build_config`, which validates a dict into it (unknown keys routed to a
  client or refused with what was likely meant).
- `query_settings`: the `query.<name>.<setting>` keys of named queries.
- `client_properties`: checks of the librdkafka properties passed through to
  the clients (runtime-owned ones, values, one cluster for all four clients).
- `guarantees`: client overrides that would break the processing guarantee.
- `loading`: `load_config`, merging base < TOML file < environment < `--set`.
- `table`: the configuration reference table of docs/configuration.md.

The checks of single values (hosts, ports, paths, wait limits) live in
`runtime.config_values`; what needs the machine (state.dir, librdkafka) is
checked at start-up by `runtime.kafka.startup_checks`.
"""

from runtime.config.client_properties import is_security_property
from runtime.config.keys import REQUIRED, ConfigError, ConfigKey
from runtime.config.loading import ENV_PREFIX, load_config
from runtime.config.query_settings import QUERY_SETTINGS
from runtime.config.settings import (
    KEYS,
    PASSTHROUGH_PREFIXES,
    ErrorHandler,
    LogLevel,
    ProcessingGuarantee,
    StreamsConfig,
    TaskAssignment,
)
from runtime.config.table import (
    CONFIG_TABLE_PAGE,
    README_TABLE_END,
    README_TABLE_START,
    config_table_markdown,
    readme_with_table,
    update_config_table,
    update_readme,
)
from runtime.config_values import JAVA_LONG_MAX, MAX_WAIT_MS, clamp_wait_s

__all__ = [
    "CONFIG_TABLE_PAGE",
    "ENV_PREFIX",
    "JAVA_LONG_MAX",
    "KEYS",
    "MAX_WAIT_MS",
    "PASSTHROUGH_PREFIXES",
    "QUERY_SETTINGS",
    "README_TABLE_END",
    "README_TABLE_START",
    "REQUIRED",
    "ConfigError",
    "ConfigKey",
    "ErrorHandler",
    "LogLevel",
    "ProcessingGuarantee",
    "StreamsConfig",
    "TaskAssignment",
    "clamp_wait_s",
    "config_table_markdown",
    "is_security_property",
    "load_config",
    "readme_with_table",
    "update_config_table",
    "update_readme",
]
