def test_agent_roundtrip(client, admin_headers):
    created = client.post("/v1/agents", json={"name": "a"}, headers=admin_headers)
    assert created.status_code == 201
    got = client.get(f"/v1/agents/{created.json['id']}", headers=admin_headers)
    assert got.json == created.json
