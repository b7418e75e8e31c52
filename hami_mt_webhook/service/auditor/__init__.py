"""The audit's runner: the loop one replica runs while it holds the Lease (`loop`), and its Events
(`events`); what it finds is the `audit` package's."""
