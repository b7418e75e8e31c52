// Package endpoint is a stand-in for vcert's (see go.mod): the types cert-manager names, no connector.
package endpoint

import (
	"errors"

	"github.com/Venafi/vcert/v5/pkg/certificate"
)

// ErrUnsupported is every stand-in connection's answer.
var ErrUnsupported = errors.New("Venafi issuers are not supported by this build of cert-manager " +
	"(the Venafi client module github.com/Venafi/vcert/v5 is not available from the Go module proxy)")

type ConnectorType int

const (
	ConnectorTypeUndefined ConnectorType = iota
	ConnectorTypeFake
	ConnectorTypeCloud
	ConnectorTypeTPP
	ConnectorTypeFirefly
	ConnectorTypeNGTS
)

type ErrCertificatePending struct {
	CertificateID string
	Status        string
}

func (e ErrCertificatePending) Error() string {
	return "certificate " + e.CertificateID + " is pending"
}

type ErrRetrieveCertificateTimeout struct{ CertificateID string }

func (e ErrRetrieveCertificateTimeout) Error() string {
	return "timed out retrieving certificate " + e.CertificateID
}

type Authentication struct {
	User         string
	Password     string
	APIKey       string
	RefreshToken string
	Scope        string
	ClientId     string
	ClientSecret string
	AccessToken  string
	ClientPKCS12 bool
	TokenURL     string
	ExternalJWT  string
	TenantID     string
}

type Policy struct {
	SubjectCNRegexes         []string
	SubjectORegexes          []string
	SubjectOURegexes         []string
	SubjectSTRegexes         []string
	SubjectLRegexes          []string
	SubjectCRegexes          []string
	AllowedKeyConfigurations []AllowedKeyConfiguration
	DnsSanRegExs             []string
	AllowWildcards           bool
}

type AllowedKeyConfiguration struct {
	KeySizes []int
}

type ZoneConfiguration struct {
	Organization       string
	OrganizationalUnit []string
	Country            string
	Province           string
	Locality           string
	Policy
}

func (z *ZoneConfiguration) UpdateCertificateRequest(*certificate.Request) {}

func (z *ZoneConfiguration) ValidateCertificateRequest(*certificate.Request) error {
	return ErrUnsupported
}

// Connector is the part of vcert's connector interface cert-manager calls.
type Connector interface {
	GetType() ConnectorType
	Ping() error
	Authenticate(auth *Authentication) error
	ReadZoneConfiguration() (*ZoneConfiguration, error)
	RequestCertificate(req *certificate.Request) (string, error)
	RetrieveCertificate(req *certificate.Request) (*certificate.PEMCollection, error)
}
