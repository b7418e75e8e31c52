//go:build tools

// Package tools names the helm command so that go.mod pins it.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
