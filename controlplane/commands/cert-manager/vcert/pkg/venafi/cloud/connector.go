// Package cloud is a stand-in for vcert's (see go.mod): its connector cannot connect.
package cloud

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
