"""What push_to_cluster reads of a registry before it copies an image from it (pure parts)."""

from bake.container import skopeo_tls
from localcloud.engines import config_digest


def test_the_image_id_is_the_config_digest_of_a_docker_or_oci_manifest():
    docker = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
              "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:ab"},
              "layers": [{"digest": "sha256:cd"}]}
    oci = {"schemaVersion": 2, "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                          "digest": "sha256:ef"}, "layers": []}
    assert config_digest(docker) == "sha256:ab"
    assert config_digest(oci) == "sha256:ef"


def test_a_list_of_manifests_or_an_old_schema_names_no_image():
    assert config_digest({"schemaVersion": 2, "manifests": [{"digest": "sha256:ab"}]}) is None
    assert config_digest({"schemaVersion": 1, "fsLayers": []}) is None


def test_plain_http_only_to_a_registry_on_loopback():
    assert skopeo_tls("127.0.0.1:5000/kiln@sha256:ab", "src-tls-verify") == ["--src-tls-verify=false"]
    assert skopeo_tls("localhost/kiln:cpu", "tls-verify") == ["--tls-verify=false"]
    assert skopeo_tls("[::1]:5000/kiln:cpu", "dest-tls-verify") == ["--dest-tls-verify=false"]
    assert skopeo_tls("10.236.0.1:5000/kiln:cpu", "src-tls-verify") == []
    assert skopeo_tls("registry.example.com/kiln:cpu", "src-tls-verify") == []
