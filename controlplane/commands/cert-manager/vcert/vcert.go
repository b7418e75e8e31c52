// Package vcert is a stand-in for Venafi's client library (see go.mod): NewClient always fails.
package vcert

import (
	"net/http"

	"github.com/Venafi/vcert/v5/pkg/endpoint"
)

// Config is the subset of vcert's connection configuration that cert-manager fills in.
type Config struct {
	ConnectorType   endpoint.ConnectorType
	BaseUrl         string
	Zone            string
	Credentials     *endpoint.Authentication
	ConnectionTrust string
	LogVerbose      bool
	Client          *http.Client
	UserAgent       *string
}

// NewClient fails: this build links no Venafi client.
func NewClient(*Config, ...bool) (endpoint.Connector, error) { return nil, endpoint.ErrUnsupported }
