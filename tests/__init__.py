"""llmitm's test suite, laid out like the package: ``tests/<package>/`` tests ``llmitm.<package>``,
``tests/e2e/`` runs real processes, ``tests/helpers/`` holds what several tests share."""
