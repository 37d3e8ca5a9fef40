# The upstream's thin callback, flattened: `{event, type, id, attributes}` instead of
# the JSON:API envelope `{"data": {"type", "id", "attributes"}}`.
#
#   [[destinations]]
#   name = "crm"
#   url = "https://crm.example.com/hooks"
#   transform = <this file, between triple single quotes: a TOML literal string,
#                so that jq's backslashes stay as they are>
{event, type: .body.data.type, id: .body.data.id, attributes: (.body.data.attributes // {})}
