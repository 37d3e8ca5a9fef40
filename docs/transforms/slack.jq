# A Slack incoming-webhook message (https://api.slack.com/messaging/webhooks) for
# each event: a one-line summary, and the resource's attributes as fields.
#
#   [[destinations]]
#   name = "slack"
#   url = "https://hooks.slack.com/services/..."
#   events = ["Action*"]
#   transform = <this file, between triple single quotes: a TOML literal string,
#                so that jq's backslashes stay as they are>
{
  text: "\(.event): \(.resource // "no resource") (\(.source))",
  blocks: [
    {type: "section", text: {type: "mrkdwn", text: "*\(.event)* on `\(.resource // "-")`, received \(.received_at)"}},
    {
      type: "section",
      fields: [
        (.body.data.attributes // {}) | to_entries[] | select(.value | type != "object" and type != "array")
        | {type: "mrkdwn", text: "*\(.key)*\n\(.value)"}
      ][:10]
    }
  ]
}
