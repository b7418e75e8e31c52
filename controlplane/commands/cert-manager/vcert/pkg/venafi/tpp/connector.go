// Package tpp is a stand-in for vcert's (see go.mod): its connector cannot connect.
package tpp

import (
	"github.com/Venafi/vcert/v5/pkg/certificate"
	"github.com/Venafi/vcert/v5/pkg/endpoint"
)

type Connector struct{}

var _ endpoint.Connector = (*Connector)(nil)

func (*Connector) GetType() endpoint.ConnectorType             { return endpoint.ConnectorTypeUndefined }
func (*Connector) Ping() error                                 { return endpoint.ErrUnsupported }
func (*Connector) Authenticate(*endpoint.Authentication) error { return endpoint.ErrUnsupported }
func (*Connector) ReadZoneConfiguration() (*endpoint.ZoneConfiguration, error) {
	return nil, endpoint.ErrUnsupported
}
func (*Connector) RequestCertificate(*certificate.Request) (string, error) {
	return "", endpoint.ErrUnsupported
}
func (*Connector) RetrieveCertificate(*certificate.Request) (*certificate.PEMCollection, error) {
	return nil, endpoint.ErrUnsupported
}

type ErrCertNotFound struct{ error }

type OauthRefreshAccessTokenResponse struct {
	Access_token  string
	Expires       int
	Identity      string
	Refresh_token string
}

type OauthVerifyTokenResponse struct {
	AccessIssuedOn string
	Application    string
	Expires        string
	GrantIssuedOn  string
	Identity       string
	Scope          string
	ValidFor       int
}

func (*Connector) ResetCertificate(*certificate.Request, bool) error { return endpoint.ErrUnsupported }

func (*Connector) GetRefreshToken(*endpoint.Authentication) (OauthRefreshAccessTokenResponse, error) {
	return OauthRefreshAccessTokenResponse{}, endpoint.ErrUnsupported
}

func (*Connector) VerifyAccessToken(*endpoint.Authentication) (OauthVerifyTokenResponse, error) {
	return OauthVerifyTokenResponse{}, endpoint.ErrUnsupported
}
