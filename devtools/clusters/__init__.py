"""What the tests run against: a control plane, real nodes, the chart installed on them, and what runs beside it."""
